//! Serving one accepted connection with hyper, inside its bounds.
//!
//! hyper's own knobs do what they can: the head limit and the read buffer
//! ([`HttpLimits::max_head_bytes`]: a larger head is answered 431 by hyper), and its header
//! timer set to [`HttpLimits::idle_timeout`], which bounds a kept-alive connection from the
//! end of one response to the end of the next request's head. What hyper does not do is
//! here: the short header timeout (from the accept, or from the first byte of a request on a
//! kept-alive connection), the eviction ([`crate::connections`]), a response that waits on a
//! client that does not read, and the 413 for a declared body.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::connections::{Rejection, Tracker};

/// How a connection ended.
enum End {
    /// hyper finished with it (the client left, asked to close, or broke the protocol).
    Closed(Result<(), hyper::Error>),
    Evicted,
    TimedOut(Rejection),
}

/// Serves `stream` until it ends, is evicted or times out; gracefully (requests in flight
/// are answered, idle connections close) once `stop` turns true. `_open` is held until the
/// connection is gone, so the server can wait for its connections.
pub(crate) async fn serve(
    stream: TcpStream,
    tracker: Arc<Tracker>,
    router: Router,
    mut stop: watch::Receiver<bool>,
    _open: watch::Receiver<()>,
) {
    let limits = *tracker.budget().limits();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout)
        .max_buf_size(limits.buffer_bytes())
        .max_header_size(limits.max_head_bytes);
    let io = TokioIo::new(Watched {
        stream,
        tracker: tracker.clone(),
    });
    let service = Tracked {
        router: TowerToHyperService::new(router),
        tracker: tracker.clone(),
    };
    let mut conn = pin!(builder.serve_connection(io, service));
    let mut evicted = pin!(tracker.evicted.notified());
    let mut stopped = pin!(async move {
        // A dropped handle counts as "stop" too.
        let _ = stop.wait_for(|stop| *stop).await;
    });
    let mut stopping = false;
    let mut timer = pin!(tokio::time::sleep_until(tokio::time::Instant::now()));
    let end = poll_fn(|cx| {
        if evicted.as_mut().poll(cx).is_ready() {
            return Poll::Ready(End::Evicted);
        }
        if !stopping && stopped.as_mut().poll(cx).is_ready() {
            stopping = true;
            conn.as_mut().graceful_shutdown();
        }
        if let Poll::Ready(result) = conn.as_mut().poll(cx) {
            return Poll::Ready(End::Closed(result));
        }
        // The phase only changes while hyper runs (above), so the deadline read here is
        // current until the next wake-up.
        if let Some((at, why)) = tracker.deadline() {
            if timer.deadline() != at {
                timer.as_mut().reset(at);
            }
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(End::TimedOut(why));
            }
        }
        Poll::Pending
    })
    .await;
    let budget = tracker.budget();
    match end {
        // Counted when it was evicted.
        End::Evicted => tracing::trace!(server = budget.server(), "connection evicted"),
        End::TimedOut(why) => {
            tracing::trace!(
                server = budget.server(),
                reason = why.label(),
                "connection timed out"
            );
            budget.count(why);
        }
        End::Closed(Ok(())) => {}
        End::Closed(Err(error)) => {
            if error.is_parse_too_large() {
                budget.count(Rejection::HeadTooLarge);
            } else if error.is_timeout() && tracker.reading() {
                // hyper's timer (the idle timeout) ended a head that started late in it.
                budget.count(Rejection::HeaderTimeout);
            }
            tracing::trace!(server = budget.server(), %error, "connection closed");
        }
    }
}

/// The router behind hyper, telling the tracker when a request starts and is answered, and
/// refusing a declared body beyond the limit before any handler runs.
struct Tracked {
    router: TowerToHyperService<Router>,
    tracker: Arc<Tracker>,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl Service<Request<Incoming>> for Tracked {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, request: Request<Incoming>) -> Answer {
        let answering = Answering::start(self.tracker.clone());
        let limit = self.tracker.budget().limits().max_body_bytes;
        // hyper's reading of Content-Length / Transfer-Encoding: an exact length, or none
        // (chunked).
        let declared = hyper::body::Body::size_hint(request.body()).upper();
        if declared.is_none_or(|length| length > limit) {
            self.tracker.budget().count(Rejection::BodyTooLarge);
            drop(answering);
            return Box::pin(std::future::ready(Ok(payload_too_large())));
        }
        let answer = self.router.call(request);
        Box::pin(async move {
            let response = answer.await;
            drop(answering);
            response
        })
    }
}

/// 413, and the connection closes: the body is never read.
fn payload_too_large() -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A request being answered: busy from creation until dropped (answered, or abandoned with
/// the connection).
struct Answering(Arc<Tracker>);

impl Answering {
    fn start(tracker: Arc<Tracker>) -> Self {
        tracker.request_started();
        Self(tracker)
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answered();
    }
}

/// The socket, telling the tracker when bytes arrive and when writes block.
struct Watched {
    stream: TcpStream,
    tracker: Arc<Tracker>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.tracker.bytes_read();
        }
        result
    }
}

impl Watched {
    fn wrote<T>(&self, result: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        self.tracker.write_blocked(result.is_pending());
        result
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.wrote(result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.wrote(result)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
