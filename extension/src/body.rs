//! Body plumbing: one boxed body type, and a wrapper that reports when and how a streamed body
//! ends.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;

use crate::runtime_api::ERROR_TYPE_HEADER;

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

/// How a body forwarded by [`NotifyOnEnd`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// Read to the end, without an error trailer.
    Complete,
    /// Read to the end, with a `Lambda-Runtime-Function-Error-Type` trailer: a streamed
    /// response whose function failed midway (the Runtime API's response streaming reports a
    /// late error so).
    ErrorTrailer,
    /// Failed while being read, or dropped before its end: not all of it went upstream.
    Broken,
}

/// Wraps a body and fires a oneshot when it has been read to the end, failed, or was dropped,
/// saying which ([`BodyEnd`]): the proxy releases a lock only after the whole response has gone
/// upstream, and marks the invocation's tick done only if it went up complete and without an
/// error trailer.
pub struct NotifyOnEnd<B: Body> {
    inner: B,
    tx: Option<oneshot::Sender<BodyEnd>>,
    error_trailer: bool,
}

impl<B: Body> NotifyOnEnd<B> {
    /// Wraps `inner`; the receiver resolves when it ends.
    pub fn new(inner: B) -> (NotifyOnEnd<B>, oneshot::Receiver<BodyEnd>) {
        let (tx, rx) = oneshot::channel();
        (
            NotifyOnEnd {
                inner,
                tx: Some(tx),
                error_trailer: false,
            },
            rx,
        )
    }

    /// How the body ended, once it has: complete, or complete with an error trailer.
    fn complete(&self) -> BodyEnd {
        if self.error_trailer {
            BodyEnd::ErrorTrailer
        } else {
            BodyEnd::Complete
        }
    }

    fn end(&mut self, end: BodyEnd) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(end);
        }
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
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if frame
                    .trailers_ref()
                    .is_some_and(|t| t.contains_key(ERROR_TYPE_HEADER))
                {
                    self.error_trailer = true;
                }
            }
            Poll::Ready(None) => {
                let end = self.complete();
                self.end(end);
            }
            Poll::Ready(Some(Err(_))) => self.end(BodyEnd::Broken),
            Poll::Pending => {}
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

impl<B: Body> Drop for NotifyOnEnd<B> {
    /// A body of known length is not polled past its last frame (the sender sees
    /// `is_end_stream`): dropped at its end, it is complete; dropped before, it is broken.
    fn drop(&mut self) {
        let end = if self.inner.is_end_stream() {
            self.complete()
        } else {
            BodyEnd::Broken
        };
        self.end(end);
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
        assert_eq!(rx.await, Ok(BodyEnd::Complete));
    }

    #[tokio::test]
    async fn tells_an_error_trailer_and_a_body_cut_short() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert(
            "Lambda-Runtime-Function-Error-Type",
            http::HeaderValue::from_static("Runtime.StreamError"),
        );
        let body = http_body_util::StreamBody::new(futures::stream::iter(vec![
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b"partial"))),
            Ok(Frame::trailers(trailers)),
        ]));
        let (body, rx) = NotifyOnEnd::new(body);
        let collected = body.collect().await.unwrap();
        assert!(collected.trailers().is_some());
        assert_eq!(rx.await, Ok(BodyEnd::ErrorTrailer));

        // Other trailers are no error.
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-t", http::HeaderValue::from_static("1"));
        let body = http_body_util::StreamBody::new(futures::stream::iter(vec![Ok::<
            _,
            std::convert::Infallible,
        >(
            Frame::<Bytes>::trailers(trailers),
        )]));
        let (body, rx) = NotifyOnEnd::new(body);
        body.collect().await.unwrap();
        assert_eq!(rx.await, Ok(BodyEnd::Complete));

        // A body that fails midway, and one dropped before its end.
        let body = http_body_util::StreamBody::new(futures::stream::iter(vec![
            Ok(Frame::data(Bytes::from_static(b"a"))),
            Err(std::io::Error::other("runtime went away")),
        ]));
        let (body, rx) = NotifyOnEnd::new(body);
        assert!(body.collect().await.is_err());
        assert_eq!(rx.await, Ok(BodyEnd::Broken));
        let body = http_body_util::StreamBody::new(futures::stream::iter(vec![Ok::<
            _,
            std::convert::Infallible,
        >(
            Frame::data(Bytes::from_static(b"a")),
        )]));
        let (body, rx) = NotifyOnEnd::new(body);
        drop(body);
        assert_eq!(rx.await, Ok(BodyEnd::Broken));

        // A body of known length, dropped after its last frame without a final poll (as a
        // sender that trusts `is_end_stream` does), or empty and never polled: complete.
        let (mut body, rx) = NotifyOnEnd::new(Full::new(Bytes::from_static(b"{}")));
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"{}"));
        assert!(body.is_end_stream());
        drop(body);
        assert_eq!(rx.await, Ok(BodyEnd::Complete));
        let (body, rx) = NotifyOnEnd::new(Full::new(Bytes::new()));
        drop(body);
        assert_eq!(rx.await, Ok(BodyEnd::Complete));
    }
}
