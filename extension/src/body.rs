//! Body plumbing: one boxed body type, and a wrapper that reports when a streamed body ends.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;

/// Boxed error of bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type of every request and response the proxy builds or forwards.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// A body of these bytes.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into()).map_err(|e| match e {}).boxed()
}

/// Any body, boxed (frames, trailers included, pass through untouched).
pub fn boxed<B>(body: B) -> ProxyBody
where
    B: Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed()
}

/// Wraps a body and fires a oneshot when it has been read to the end, failed, or was dropped:
/// the proxy releases a lock only after the whole response has gone upstream.
pub struct NotifyOnEnd<B> {
    inner: B,
    tx: Option<oneshot::Sender<()>>,
}

impl<B> NotifyOnEnd<B> {
    /// Wraps `inner`; the receiver resolves when it ends.
    pub fn new(inner: B) -> (NotifyOnEnd<B>, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        (
            NotifyOnEnd {
                inner,
                tx: Some(tx),
            },
            rx,
        )
    }
}

impl<B: Body + Unpin> Body for NotifyOnEnd<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            if let Some(tx) = self.tx.take() {
                let _ = tx.send(());
            }
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

impl<B> Drop for NotifyOnEnd<B> {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fires_at_the_end_and_keeps_trailers() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-t", http::HeaderValue::from_static("1"));
        let body = http_body_util::StreamBody::new(futures::stream::iter(vec![
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b"ab"))),
            Ok(Frame::trailers(trailers)),
        ]));
        let (body, mut rx) = NotifyOnEnd::new(body);
        assert!(rx.try_recv().is_err());
        let collected = body.collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["x-t"], "1");
        assert_eq!(collected.to_bytes(), Bytes::from_static(b"ab"));
        assert!(rx.await.is_ok());
    }
}
