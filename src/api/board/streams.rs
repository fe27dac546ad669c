//! Every stream delayq writes to, with its pending messages, rate, dead letters and
//! consumer groups, as the dashboard's Streams page shows them.

use super::series::Series;
use super::*;

/// Every target stream delayq knows of.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct StreamTable {
    streams: Vec<StreamView>,
    /// False when the last count stopped early on a very large backlog (or there
    /// is none yet).
    exact: bool,
    /// When the leader last counted the pending messages per stream (it does every
    /// 2 to 30 s, by the backlog; Redis's clock, epoch ms); null before its first
    /// count. Held, paused, delivered, dead letters and groups are read live.
    #[schema(required)]
    counted_at_ms: Option<u64>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct StreamView {
    stream: String,
    /// Scheduled and not yet forwarded, held ones included, as last counted.
    pending: u64,
    /// Of those, due within the hour after the count.
    due_next_hour: u64,
    /// Due, waiting for the stream's rate limit or its pause.
    held: u64,
    paused: bool,
    /// Over the last minute of samples.
    delivered_per_s: f64,
    /// Delivered in each minute of the last hour, oldest first (60 counts, from the
    /// leaders' forwarding samples).
    delivered_last_hour: Vec<u64>,
    /// Dead-lettered in each minute of the last hour (past their ttl, or out of
    /// attempts), oldest first.
    dead_last_hour: Vec<u64>,
    /// The worst lateness (ms) of each minute of the last hour, oldest first, of the
    /// forwards no held set kept (0: none that minute).
    worst_lateness_last_hour: Vec<u64>,
    /// With `window=day`: delivered in each quarter hour of the last day, oldest
    /// first (96 counts; the last is the quarter hour under way).
    #[serde(skip_serializing_if = "Option::is_none")]
    delivered_last_day: Option<Vec<u64>>,
    /// With `window=day`: dead-lettered in each quarter hour of the last day.
    #[serde(skip_serializing_if = "Option::is_none")]
    dead_last_day: Option<Vec<u64>>,
    /// With `window=day`: the worst lateness (ms) of each quarter hour of the day.
    #[serde(skip_serializing_if = "Option::is_none")]
    worst_lateness_last_day: Option<Vec<u64>>,
    /// `streams.max_rate` for it, if it has a limit of its own (messages a second).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_rate: Option<u64>,
    /// Entries in its dead-letter stream.
    dead: u64,
    dead_letter_stream: String,
    groups: Vec<GroupView>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct GroupView {
    name: String,
    /// Entries the group has not been given yet; null when Redis cannot tell.
    #[schema(required)]
    lag: Option<u64>,
    /// Given and not acknowledged.
    pending: u64,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct StreamsQuery {
    /// `hour` (the default): each stream's last hour, a minute a point; `day`: its
    /// last day too, a quarter hour a point (the `*_last_day` series).
    #[serde(default, deserialize_with = "blank_as_none")]
    window: Option<String>,
}

/// Per target stream: pending, due within the hour, held, paused, delivered/s, dead letters, consumer groups; its last hour (and day)
#[utoipa::path(get, path = "/v1/streams", operation_id = "streams",
    params(StreamsQuery),
    responses(
        (status = 200, description = "the streams", body = StreamTable),
        (status = 400, description = "query cannot be parsed, or names an unknown parameter (bad_query)", body = ErrorBody),
        (status = 422, description = "window is neither hour nor day", body = ErrorBody),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn streams(
    State(state): State<AppState>,
    reach: Reach,
    StrictQuery(query): StrictQuery<StreamsQuery>,
) -> Result<Json<StreamTable>, ApiError> {
    let with_day = match query.window.as_deref() {
        None | Some("hour") => false,
        Some("day") => true,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "window {other:?}: must be hour or day"
            )));
        }
    };
    let mut table = table_in(&state, &state.board.streams, BTreeSet::new())
        .await?
        .as_ref()
        .clone();
    if with_day {
        let (rollups, samples) = tokio::try_join!(state.store.rollups(), state.store.samples())?;
        let now = now_ms();
        let day = day::day(
            &parse_samples(&rollups, now.saturating_sub(25 * 3_600_000)),
            &parse_samples(
                &samples,
                now.saturating_sub(crate::registry::rollup::QUARTER_MS),
            ),
            now,
        );
        // A stream with traffic earlier in the day and none within the hour is
        // listed in the day too.
        let listed: BTreeSet<&str> = table.streams.iter().map(|v| v.stream.as_str()).collect();
        let earlier: BTreeSet<String> = day
            .delivered
            .keys()
            .chain(day.dead.keys())
            .filter(|s| !listed.contains(s.as_str()))
            .cloned()
            .collect();
        if !earlier.is_empty() {
            table = table_in(&state, &state.board.streams_day, earlier)
                .await?
                .as_ref()
                .clone();
        }
        for view in &mut table.streams {
            view.delivered_last_day = Some(day.line(&day.delivered, &view.stream));
            view.dead_last_day = Some(day.line(&day.dead, &view.stream));
            view.worst_lateness_last_day = Some(day.line(&day.worst, &view.stream));
        }
    }
    // Only the streams the token reaches.
    table.streams.retain(|view| reach.sees(&view.stream));
    Ok(Json(table))
}

/// The stream table with the `extra` streams: `slot`'s while it is fresh
/// ([`STREAMS_TTL`]) and lists the same ones, else computed now and kept there.
async fn table_in(
    state: &AppState,
    slot: &TableSlot,
    extra: BTreeSet<String>,
) -> Result<Arc<StreamTable>, ApiError> {
    let mut cached = slot.lock().await;
    if let Some((at, listed, table)) = cached.as_ref()
        && at.elapsed() < STREAMS_TTL
        && *listed == extra
    {
        return Ok(table.clone());
    }
    let fresh = Arc::new(compute_streams(state, extra.clone()).await?);
    *cached = Some((Instant::now(), extra, fresh.clone()));
    Ok(fresh)
}

/// The table of every stream with messages, held or paused ones, traffic within the
/// hour or a setting of its own, and the `extra` ones.
pub(super) async fn compute_streams(
    state: &AppState,
    extra: BTreeSet<String>,
) -> Result<StreamTable, ApiError> {
    let store = &state.store;
    let config = state.current_config();
    let (counts, held, paused, samples) = tokio::try_join!(
        store.stream_counts(),
        store.held(),
        store.paused(),
        store.samples(),
    )?;
    let counted_at_ms = counts.as_ref().map(|c| c.at_ms);
    let exact = counts.as_ref().is_some_and(|c| c.exact);
    let counts = counts.map(|c| c.streams).unwrap_or_default();
    let now = now_ms();
    let recent = parse_samples(&samples, now.saturating_sub(60_000));
    let mut delivered: BTreeMap<String, u64> = BTreeMap::new();
    for s in &recent {
        for (stream, n) in &s.streams {
            *delivered.entry(stream.clone()).or_default() += n;
        }
    }
    let last_hour = parse_samples(&samples, now.saturating_sub(3_600_000));
    let records: Vec<(u64, &SampleRecord)> = last_hour.iter().map(|s| (s.t_ms, s)).collect();
    let hour = Series::of(&records, now, 60_000, 60);
    let mut names: BTreeSet<String> = extra;
    names.extend(counts.keys().filter(|s| !s.is_empty()).cloned());
    names.extend(held.per_stream.keys().cloned());
    names.extend(paused.iter().cloned());
    // A stream drained by now stays listed while it had traffic within the hour.
    names.extend(hour.delivered.keys().cloned());
    names.extend(hour.dead.keys().cloned());
    names.extend(config.delivery.streams.iter().map(|d| d.stream.clone()));
    names.extend(config.streams.max_rate.iter().map(|(s, _)| s.clone()));
    let mut names: Vec<String> = names.into_iter().collect();
    names.sort_by_key(|s| std::cmp::Reverse(counts.get(s).map_or(0, |c| c.0)));
    names.truncate(MAX_STREAMS);
    names.sort();
    let dead_names: Vec<String> = names.iter().map(|s| config.dead_letter_stream(s)).collect();
    let dead = store.stream_lengths(&dead_names).await?;
    let groups = futures::future::try_join_all(names.iter().map(|s| store.groups_of(s))).await?;
    let streams = names
        .into_iter()
        .zip(dead_names)
        .zip(dead)
        .zip(groups)
        .map(
            |(((stream, dead_letter_stream), dead), groups)| StreamView {
                pending: counts.get(&stream).map_or(0, |c| c.0),
                due_next_hour: counts.get(&stream).map_or(0, |c| c.1),
                held: held.per_stream.get(&stream).copied().unwrap_or(0),
                paused: paused.contains(&stream),
                delivered_per_s: delivered.get(&stream).copied().unwrap_or(0) as f64 / 60.0,
                delivered_last_hour: hour.line(&hour.delivered, &stream),
                dead_last_hour: hour.line(&hour.dead, &stream),
                worst_lateness_last_hour: hour.line(&hour.worst, &stream),
                delivered_last_day: None,
                dead_last_day: None,
                worst_lateness_last_day: None,
                max_rate: config
                    .streams
                    .max_rate
                    .iter()
                    .find(|(s, _)| *s == stream)
                    .map(|(_, n)| *n),
                dead,
                dead_letter_stream,
                groups: groups
                    .into_iter()
                    .map(|g| GroupView {
                        name: g.name,
                        lag: g.lag,
                        pending: g.pending,
                    })
                    .collect(),
                stream,
            },
        )
        .collect();
    Ok(StreamTable {
        streams,
        exact,
        counted_at_ms,
    })
}
