//! What the dashboard's Admin page reads and does: the shards' fences, and pausing
//! and resuming a stream.

use super::*;

/// The shards' fences.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Fences {
    highest: u64,
    shards: Vec<ShardFence>,
    /// The epoch of the leader this node knows of.
    #[schema(required)]
    leader_epoch: Option<u64>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ShardFence {
    shard: u16,
    /// The highest epoch that touched the shard (0: none yet).
    fence: u64,
}

/// Each shard's fence: the highest leader epoch that touched it
#[utoipa::path(get, path = "/v1/fences", operation_id = "fences",
    responses(
        (status = 200, description = "the fences", body = Fences),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn fences(State(state): State<AppState>) -> Result<Json<Fences>, ApiError> {
    let shards = state.store.fences().await?;
    Ok(Json(Fences {
        highest: shards.iter().map(|(_, f)| *f).max().unwrap_or(0),
        shards: shards
            .into_iter()
            .map(|(shard, fence)| ShardFence { shard, fence })
            .collect(),
        leader_epoch: state.leadership.info().epoch,
    }))
}

/// A stream's forwarding state.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct PauseAnswer {
    stream: String,
    paused: bool,
    /// Whether this request changed it.
    changed: bool,
    /// The journal (`[journal]`) did not take the change within 1 s: a loss of
    /// Redis's data before it does would undo it. Repeating it is safe.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    not_journaled: bool,
}

/// Pause forwarding to a stream: its messages wait, in due order, until it is resumed
#[utoipa::path(post, path = "/v1/streams/{stream}/pause", operation_id = "pauseStream", params(StreamPath),
    responses(
        (status = 200, description = "paused (takes effect within 250 ms)", body = PauseAnswer),
        (status = 400, description = "the stream name breaks a rule", body = ErrorBody),
        (status = 503, description = "Redis unavailable; or made, but fewer replicas than redis.min_replicas_acked confirmed it in time (not_replicated; asking again is safe)", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn pause(
    state: State<AppState>,
    path: Path<StreamPath>,
) -> Result<Json<PauseAnswer>, ApiError> {
    set_paused(state, path, true).await
}

/// Resume forwarding to a paused stream: what waited goes first, in due order
#[utoipa::path(post, path = "/v1/streams/{stream}/resume", operation_id = "resumeStream", params(StreamPath),
    responses(
        (status = 200, description = "resumed", body = PauseAnswer),
        (status = 400, description = "the stream name breaks a rule", body = ErrorBody),
        (status = 503, description = "Redis unavailable; or made, but fewer replicas than redis.min_replicas_acked confirmed it in time (not_replicated; asking again is safe)", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn resume(
    state: State<AppState>,
    path: Path<StreamPath>,
) -> Result<Json<PauseAnswer>, ApiError> {
    set_paused(state, path, false).await
}

pub(super) async fn set_paused(
    State(state): State<AppState>,
    Path(StreamPath { stream }): Path<StreamPath>,
    paused: bool,
) -> Result<Json<PauseAnswer>, ApiError> {
    crate::message::validate_stream(&stream)?;
    let sent = std::time::Instant::now();
    let (changed, at_ms, replicated) = state.store.set_paused(&stream, paused).await?;
    if changed {
        tracing::info!(%stream, paused, "stream forwarding {}", if paused { "paused" } else { "resumed" });
    }
    // Kept in the journal too, so that a restore after a loss of Redis's data
    // pauses the stream again before forwarding resumes.
    let not_journaled = match state.ingest.journal() {
        Some(journal) => {
            let write = async {
                journal
                    .set_paused(&stream, paused, at_ms)
                    .await
                    .map(|()| true)
            };
            !crate::journal::durable::journaled(&state.store, sent, write).await
        }
        None => false,
    };
    *state.board.streams.lock().await = None;
    // Made and journaled, but not confirmed by enough replicas: 503 not_replicated
    // (asking again is safe).
    replicated?;
    Ok(Json(PauseAnswer {
        stream,
        paused,
        changed,
        not_journaled,
    }))
}
