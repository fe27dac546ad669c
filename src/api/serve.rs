//! The API served on its listener: the router wrapped, whole, in what every request
//! goes through outside the routes. axum completes some answers (the `Allow` header
//! of a 405) outside route-level layers, so this wraps the router as a service
//! rather than layering it.

use std::future::{Future, IntoFuture};

use axum::ServiceExt;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use tokio_util::sync::CancellationToken;
use tower_layer::Layer;

use super::listener::{Listener, Peer};
use super::{AppState, drain, error, router};

/// Serves the API on `listener` until `stop` is cancelled, then lets the requests
/// in progress finish.
pub fn serve(
    listener: Listener,
    state: AppState,
    stop: CancellationToken,
) -> impl Future<Output = std::io::Result<()>> + Send + 'static {
    let app = axum::middleware::from_fn(outside).layer(router(state));
    axum::serve(
        listener,
        ServiceExt::<Request>::into_make_service_with_connect_info::<Peer>(app),
    )
    .with_graceful_shutdown(stop.cancelled_owned())
    .into_future()
}

/// Every error answer in the JSON shape, axum's own included (`error::json_errors`),
/// and the request's body the handlers left read and dropped before the answer goes
/// out (`drain`).
async fn outside(request: Request, next: Next) -> Response {
    let (request, unread) = drain::lend(request);
    let response = error::json_errors(next.run(request).await).await;
    unread.finish().await;
    response
}
