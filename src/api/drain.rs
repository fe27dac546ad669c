//! Request bodies no handler read are read and dropped before the answer goes out.
//!
//! An answer given before the request's body has arrived (a 413 past the limit, a
//! 401/403 before the body is looked at, a 404 or 405 with a body) would otherwise
//! close the connection while the client is still sending: its next write fails and
//! it never reads the answer. So the body is lent to the handlers through a shared
//! slot, and what they left is read here, up to a bound and for a bounded time; past
//! either, the connection closes under the sender as before.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, BodyDataStream, Bytes, HttpBody};
use axum::extract::Request;
use futures::{Stream, StreamExt};

/// Most bytes of a body left unread that are read and dropped.
const DRAIN_LIMIT: usize = 8 << 20;
/// Longest time spent reading them.
const DRAIN_TIME: Duration = Duration::from_secs(5);

type Slot = Arc<Mutex<Option<BodyDataStream>>>;

/// The request body as the handlers see it: the stream in the shared slot.
struct Lent(Slot);

impl Stream for Lent {
    type Item = Result<Bytes, axum::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut slot = self.0.lock().expect("body slot");
        match slot.as_mut() {
            Some(stream) => stream.poll_next_unpin(cx),
            None => Poll::Ready(None),
        }
    }
}

/// Lends `request`'s body to the handlers (see the module); `finish` then reads and
/// drops what they left. A body that has nothing to read (none, or a
/// `content-length` of 0) is handed on as it is.
pub(super) fn lend(request: Request) -> (Request, Unread) {
    if request.body().is_end_stream() {
        return (request, Unread(None));
    }
    let (parts, body) = request.into_parts();
    let slot: Slot = Arc::new(Mutex::new(Some(body.into_data_stream())));
    let lent = Body::from_stream(Lent(slot.clone()));
    (Request::from_parts(parts, lent), Unread(Some(slot)))
}

/// What the handlers left of a lent body (None: nothing was lent).
pub(super) struct Unread(Option<Slot>);

impl Unread {
    /// Reads and drops it, up to [`DRAIN_LIMIT`] bytes and for [`DRAIN_TIME`].
    pub(super) async fn finish(self) {
        let Some(slot) = self.0 else {
            return;
        };
        let rest = slot.lock().expect("body slot").take();
        let Some(mut rest) = rest else {
            return;
        };
        let _ = tokio::time::timeout(DRAIN_TIME, async {
            let mut read = 0usize;
            while read <= DRAIN_LIMIT {
                match rest.next().await {
                    Some(Ok(chunk)) => read += chunk.len(),
                    _ => break,
                }
            }
        })
        .await;
    }
}
