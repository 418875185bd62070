//! Keep-alive only where the request body was read to its end.
//!
//! A handler that answers before reading the body (a refused API key, an unknown route, a body declared larger
//! than the limit) leaves the rest of the body on the connection. hyper then closes the connection after the
//! response, but whether it says so in the response (`Connection: close`) depends on when the body arrives, so a
//! client could reuse the connection for its next request and see it closed under that request. This layer tracks
//! whether the body reached its end and, when it did not, puts `Connection: close` on the response, so the client
//! always knows.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// A request body that records when it has been read to its end.
struct Tracked {
    inner: Body,
    done: Arc<AtomicBool>,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.done.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The middleware: `Connection: close` on every response whose request body was not read to its end.
pub async fn close_unless_body_read(req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let done = Arc::new(AtomicBool::new(body.is_end_stream()));
    let req = Request::from_parts(parts, Body::new(Tracked { inner: body, done: done.clone() }));
    let mut resp = next.run(req).await;
    if !done.load(Ordering::Acquire) {
        resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use axum::Router;
    use tower::ServiceExt;

    fn app() -> Router {
        Router::new()
            .route("/read", post(|body: Bytes| async move { format!("{}", body.len()) }))
            .route("/ignore", post(|| async { "not read" }))
            .layer(axum::middleware::from_fn(close_unless_body_read))
    }

    async fn connection_header(path: &str, body: &'static str) -> Option<String> {
        let req = Request::post(path).body(Body::from(body)).unwrap();
        let resp = app().oneshot(req).await.unwrap();
        resp.headers().get(header::CONNECTION).map(|v| v.to_str().unwrap().to_owned())
    }

    #[tokio::test]
    async fn an_unread_body_closes_the_connection_and_a_read_one_does_not() {
        assert_eq!(connection_header("/ignore", "{\"a\":1}").await.as_deref(), Some("close"));
        assert_eq!(connection_header("/read", "{\"a\":1}").await, None);
        // An empty body has nothing left on the connection.
        assert_eq!(connection_header("/ignore", "").await, None);
    }
}
