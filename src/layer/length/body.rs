//! The request body held to its declared length, [`DeclaredBody`], and
//! the error it fails with past that length, [`BodyTooLong`].

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::error::Error;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project! {
    /// A request body held to its declared length: it yields the inner
    /// body's frames while their bytes fit the declared length, and fails
    /// with [`BodyTooLong`] (as a boxed error) instead of the frame that
    /// would go past it. A body shorter than it declared ends as it does:
    /// it paid for bytes it did not send.
    ///
    /// # Examples
    ///
    /// ```
    /// use http_body_util::{BodyExt, Full};
    /// use keyrate::layer::{BodyTooLong, DeclaredLengthLayer};
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let read = service_fn(|request: http::Request<keyrate::layer::DeclaredBody<Full<bytes::Bytes>>>| async move {
    ///     let error = request.into_body().collect().await.unwrap_err();
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(error.to_string()))
    /// });
    /// let service = DeclaredLengthLayer::new().layer(read);
    /// let lying = http::Request::post("/").header("content-length", "3").body(Full::from("hello")).unwrap();
    /// let response = service.oneshot(lying).await.unwrap();
    /// assert_eq!(response.body(), &BodyTooLong { declared: 3 }.to_string());
    /// # });
    /// ```
    #[derive(Debug)]
    pub struct DeclaredBody<B> {
        #[pin]
        inner: B,
        // The declared length, in bytes.
        declared: u64,
        // The bytes still allowed: `declared` less those yielded.
        left: u64,
    }
}

impl<B> DeclaredBody<B> {
    /// `inner`, held to `declared` bytes.
    pub(super) fn new(inner: B, declared: u64) -> Self {
        DeclaredBody {
            inner,
            declared,
            left: declared,
        }
    }

    /// The length the request declared.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::DeclaredLengthLayer;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let declared = service_fn(|request: http::Request<keyrate::layer::DeclaredBody<String>>| async move {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(request.body().declared().to_string()))
    /// });
    /// let request = http::Request::post("/").header("content-length", "2").body(String::from("hi")).unwrap();
    /// let response = DeclaredLengthLayer::new().layer(declared).oneshot(request).await.unwrap();
    /// assert_eq!(response.body(), "2");
    /// # });
    /// ```
    #[must_use]
    pub fn declared(&self) -> u64 {
        self.declared
    }
}

impl<B> Body for DeclaredBody<B>
where
    B: Body,
    B::Error: Into<Box<dyn Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = Box<dyn Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = match std::task::ready!(this.inner.poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(err)) => return Poll::Ready(Some(Err(err.into()))),
            None => return Poll::Ready(None),
        };
        if let Some(data) = frame.data_ref() {
            let len = data.remaining() as u64;
            if len > *this.left {
                *this.left = 0;
                let declared = *this.declared;
                return Poll::Ready(Some(Err(Box::new(BodyTooLong { declared }))));
            }
            *this.left -= len;
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let upper = inner.upper().unwrap_or(u64::MAX).min(self.left);
        let mut hint = SizeHint::new();
        // The upper bound first: a lower bound above it panics.
        hint.set_upper(upper);
        hint.set_lower(inner.lower().min(upper));
        hint
    }
}

/// The error of a [`DeclaredBody`] whose body went past its declared
/// length.
///
/// # Examples
///
/// ```
/// use keyrate::layer::BodyTooLong;
///
/// assert_eq!(
///     BodyTooLong { declared: 100 }.to_string(),
///     "the request body is longer than its Content-Length (100 bytes)"
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyTooLong {
    /// The length the request declared.
    pub declared: u64,
}

impl fmt::Display for BodyTooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the request body is longer than its Content-Length ({} bytes)",
            self.declared
        )
    }
}

impl Error for BodyTooLong {}
