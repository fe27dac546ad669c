//! The messages due next, a page at a time, as the dashboard's Messages page lists them.

use super::*;

/// A page of the next messages due.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct UpcomingQuery {
    /// Only messages to this stream.
    #[serde(default, deserialize_with = "blank_as_none")]
    stream: Option<String>,
    /// Start after this cursor (the `next` of the page before).
    #[serde(default, deserialize_with = "blank_as_none")]
    after: Option<String>,
    /// At most this many messages: 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    #[serde(default, deserialize_with = "blank_as_none")]
    limit: Option<usize>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct UpcomingPage {
    messages: Vec<UpcomingView>,
    /// The `after` of the next page; null once every message was listed.
    #[schema(required)]
    next: Option<String>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct UpcomingView {
    id: String,
    stream: String,
    /// Epoch milliseconds.
    deliver_at: u64,
    priority: u8,
    /// Due, and waiting for its stream's rate limit or its pause.
    held: bool,
}

/// The next messages due, in due order, of every stream or of one
#[utoipa::path(get, path = "/v1/upcoming", operation_id = "upcoming", params(UpcomingQuery),
    responses(
        (status = 200, description = "a page of messages; a page may be short (even empty) with a `next` when a stream filter matches little", body = UpcomingPage),
        (status = 400, description = "the query cannot be parsed, or names an unknown parameter (bad_query)", body = ErrorBody),
        (status = 403, description = "the stream is out of the token's reach (stream_not_permitted)", body = ErrorBody),
        (status = 422, description = "a parameter breaks a rule (limit out of range, a cursor not given by `next`, a bad stream name); the detail names it", body = ErrorBody),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn upcoming(
    State(state): State<AppState>,
    reach: Reach,
    StrictQuery(q): StrictQuery<UpcomingQuery>,
) -> Result<Json<UpcomingPage>, ApiError> {
    let limit = match q.limit {
        None => 50,
        Some(n @ 1..=1000) => n,
        Some(n) => {
            return Err(ApiError::invalid(format!(
                "limit: {n} is not between 1 and 1000"
            )));
        }
    };
    if let Some(stream) = q.stream.as_deref() {
        crate::message::validate_stream(stream)?;
        reach.check(stream)?;
    }
    let after = q.after.as_deref().map(parse_cursor).transpose()?;
    let page = state
        .store
        .upcoming(
            after.as_ref().map(|(s, id)| (*s, id.as_str())),
            limit,
            q.stream.as_deref(),
        )
        .await?;
    Ok(Json(UpcomingPage {
        messages: page
            .messages
            .into_iter()
            // Only the streams the token reaches: a page may come out short.
            .filter(|m| reach.sees(&m.stream))
            .map(|m| UpcomingView {
                deliver_at: m.score / 10,
                priority: 9 - (m.score % 10) as u8,
                id: m.id,
                stream: m.stream,
                held: m.held,
            })
            .collect(),
        next: page.next.map(|(score, id)| format!("{score}-{id}")),
    }))
}

/// A cursor `<score>-<id>`, as `next` gives it.
pub(super) fn parse_cursor(cursor: &str) -> Result<(u64, String), ApiError> {
    let bad = || {
        ApiError::invalid(format!(
            "after: {cursor:?} is not a cursor this endpoint gave (`next`)"
        ))
    };
    let (score, id) = cursor.split_once('-').ok_or_else(bad)?;
    let score: u64 = score.parse().map_err(|_| bad())?;
    let id = crate::message::MessageId::parse(id).map_err(|_| bad())?;
    Ok((score, id.as_str().to_owned()))
}
