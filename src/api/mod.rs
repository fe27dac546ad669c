//! The HTTP API. Handlers validate input and call `store`; they never build a
//! Redis key.

mod access;
mod admin;
mod around;
mod audit;
mod auth;
mod board;
mod dead;
mod drain;
mod error;
mod finished;
mod guard;
mod input;
mod keys;
pub mod listener;
mod messages;
mod meters;
mod node;
mod openapi;
mod query;
mod reach;
mod restore;
mod schedules;
mod serve;
mod stats;
mod streams;
pub mod tls;
mod ui;

use std::sync::Arc;

use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use admin::{ReloadRequest, Reloaded};
pub use board::BoardCache;
pub use error::{ApiError, ErrorBody};
pub use meters::Meters;
pub use serve::serve;

use crate::config::Config;
use crate::leadership::Leadership;
use crate::store::Store;

/// What every handler can reach: one `Arc`, so that the clone axum makes for each
/// request (and for each middleware layer) is one reference count, not a copy of
/// every handle in [`App`].
#[derive(Clone)]
pub struct AppState(Arc<App>);

impl AppState {
    pub fn new(app: App) -> AppState {
        AppState(Arc::new(app))
    }
}

impl std::ops::Deref for AppState {
    type Target = App;
    fn deref(&self) -> &App {
        &self.0
    }
}

/// The handles behind [`AppState`].
pub struct App {
    /// The configuration at start. Keys that a reload may change (see
    /// `crate::reload::RELOADABLE`) are read from `live_config` instead.
    pub config: Arc<Config>,
    pub live_config: tokio::sync::watch::Receiver<Arc<Config>>,
    pub store: Store,
    /// Pushes go through it: journal first while the journal is on.
    pub ingest: crate::ingest::Ingest,
    pub leadership: Leadership,
    /// `election.mode = "per_shard"`: each election group and who leads it (empty
    /// in the single-leader mode).
    pub groups: Arc<[crate::leadership::Group]>,
    /// The Redis write probe's findings, for `/healthz` and `/readyz`.
    pub health: crate::health::Health,
    pub metrics: PrometheusHandle,
    /// The dashboard's answers computed recently.
    pub board: BoardCache,
    /// The request meters, registered once each.
    pub meters: Meters,
    /// Where `POST /v1/admin/reload` asks for a reload, once the process takes
    /// reload requests (None until then: it may never reread a file).
    pub reloads: tokio::sync::watch::Receiver<Option<tokio::sync::mpsc::Sender<ReloadRequest>>>,
}

impl App {
    /// The running configuration, with the latest reload applied.
    pub fn current_config(&self) -> Arc<Config> {
        self.live_config.borrow().clone()
    }
}

/// Every route of the API, in the groups that are bounded alike. The router is built
/// from these and from nothing else, and so is the OpenAPI document (`openapi.rs`):
/// `routes!` takes each route's method and path from its handler's
/// `#[utoipa::path]`, so a route is documented as it is served.
struct Routes {
    /// `/v1`: at most `api.max_concurrent_requests` at once (with the polls), each
    /// answered within `api.request_timeout`.
    requests: OpenApiRouter<AppState>,
    /// Long polls, which wait up to `api.max_wait` by design: that much longer; and
    /// a switchover, which waits for the new leader.
    polls: OpenApiRouter<AppState>,
    /// Outside the bounds, and open: load balancers and scrapers get their answer
    /// under overload too.
    open: OpenApiRouter<AppState>,
}

fn routes() -> Routes {
    use messages::{batch, by_id, history, push};
    Routes {
        requests: OpenApiRouter::new()
            .routes(routes!(push::push))
            // The static segment wins over `{id}`: GET and DELETE here still reach
            // the message whose id is "batch".
            .routes(routes!(
                batch::batch,
                by_id::status_of_batch,
                by_id::cancel_of_batch
            ))
            .routes(routes!(by_id::status, by_id::cancel))
            .routes(routes!(by_id::reschedule))
            .routes(routes!(history::history))
            .routes(routes!(dead::list))
            .routes(routes!(dead::replay))
            .routes(routes!(dead::purge))
            .routes(routes!(keys::list, keys::cancel))
            .routes(routes!(finished::list))
            .routes(routes!(schedules::create, schedules::list))
            .routes(routes!(schedules::get, schedules::put, schedules::delete))
            .routes(routes!(schedules::pause))
            .routes(routes!(schedules::resume))
            .routes(routes!(stats::stats))
            .routes(routes!(streams::ack))
            .routes(routes!(openapi::document))
            .routes(routes!(node::leader))
            .routes(routes!(node::resign))
            .routes(routes!(restore::restore_all))
            .routes(routes!(restore::restore_one))
            .routes(routes!(board::session))
            .routes(routes!(board::overview))
            .routes(routes!(board::nodes))
            .routes(routes!(board::history))
            .routes(routes!(board::streams))
            .routes(routes!(board::upcoming))
            .routes(routes!(board::fences))
            .routes(routes!(board::pause))
            .routes(routes!(board::resume))
            .routes(routes!(admin::reload))
            .routes(routes!(audit::trail)),
        polls: OpenApiRouter::new()
            .routes(routes!(streams::next))
            .routes(routes!(admin::switchover)),
        open: OpenApiRouter::new()
            .routes(routes!(node::leader_only))
            .routes(routes!(node::healthz))
            .routes(routes!(node::readyz))
            .routes(routes!(node::render_metrics))
            .routes(routes!(ui::index))
            .routes(routes!(ui::script))
            .routes(routes!(ui::style)),
    }
}

fn router(state: AppState) -> Router {
    let api = &state.config.api;
    let Routes {
        requests,
        polls,
        open,
    } = routes();
    // One bound for every guarded route together.
    let permits = Arc::new(tokio::sync::Semaphore::new(api.max_concurrent_requests));
    let polls = guard::guarded(
        Router::from(polls),
        &permits,
        api.max_concurrent_requests,
        api.max_wait + api.request_timeout,
        "api.max_wait + api.request_timeout",
    );
    let requests = guard::guarded(
        Router::from(requests),
        &permits,
        api.max_concurrent_requests,
        api.request_timeout,
        "api.request_timeout",
    );
    // Served whole inside what every request goes through outside the routes (serve.rs).
    requests
        .merge(polls)
        .merge(Router::from(open))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            around::around,
        ))
        .with_state(state)
}
