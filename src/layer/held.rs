//! A permit held for a request: shared between the request's extensions
//! (where a handler may take it) and the response body (which gives it
//! back when it ends).

use crate::concurrency::Permit;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use parking_lot::Mutex;
use pin_project_lite::pin_project;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The permit the [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer)
/// took for a request, in the request's extensions: a [`Permit`] over the
/// in-memory limiter, a [`RedisPermit`](crate::RedisPermit) over the Redis
/// one (`HeldPermit<RedisPermit>`).
///
/// The layer gives it back when the response body has been sent (or
/// dropped). A handler whose work outlives the response (a WebSocket
/// stream, a job in the background) [`take`](Self::take)s it and moves the
/// [`Permit`] into that work: the permit is then held until the work drops
/// it, and the response body no longer gives it back. Clones share one
/// permit.
///
/// # Examples
///
/// ```
/// use keyrate::layer::HeldPermit;
///
/// // In a handler: take the permit for a stream's whole life.
/// fn upgrade(request: &http::Request<()>) -> Option<keyrate::Permit> {
///     request.extensions().get::<HeldPermit>()?.take()
/// }
/// # assert!(upgrade(&http::Request::new(())).is_none());
/// ```
pub struct HeldPermit<P = Permit>(Arc<Mutex<Option<P>>>);

impl<P> Clone for HeldPermit<P> {
    fn clone(&self) -> Self {
        HeldPermit(Arc::clone(&self.0))
    }
}

impl<P> HeldPermit<P> {
    pub(super) fn new(permit: P) -> Self {
        HeldPermit(Arc::new(Mutex::new(Some(permit))))
    }

    /// Takes the permit out, for work that outlives the response: `None`
    /// if it was taken already (or given back).
    ///
    /// # Examples
    ///
    /// ```
    /// use keyrate::layer::{bearer_token, ConcurrencyLimitLayer, HeldPermit};
    /// use keyrate::{ConcurrencyLimiter, Permit};
    /// use std::sync::{Arc, Mutex};
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Arc::new(ConcurrencyLimiter::new(1));
    /// let kept: Arc<Mutex<Vec<Permit>>> = Arc::default();
    /// let stash = Arc::clone(&kept);
    /// let service = ConcurrencyLimitLayer::new(Arc::clone(&limiter), bearer_token).layer(
    ///     service_fn(move |request: http::Request<()>| {
    ///         let held = request.extensions().get::<HeldPermit>().unwrap();
    ///         stash.lock().unwrap().extend(held.take()); // the stream's now
    ///         async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) }
    ///     }),
    /// );
    /// let request = http::Request::get("/").header("authorization", "Bearer k").body(()).unwrap();
    /// drop(service.oneshot(request).await.unwrap()); // the response and its body are gone
    /// assert_eq!(limiter.held("k"), 1); // still held by the stash
    /// kept.lock().unwrap().clear();
    /// assert_eq!(limiter.held("k"), 0);
    /// # });
    /// ```
    #[must_use = "the permit is given back as soon as it is dropped"]
    pub fn take(&self) -> Option<P> {
        self.0.lock().take()
    }

    /// Whether the permit is still here: neither taken nor given back.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn check(held: &keyrate::layer::HeldPermit) {
    /// if held.is_held() {
    ///     // the response body will give it back
    /// }
    /// # }
    /// ```
    #[must_use]
    pub fn is_held(&self) -> bool {
        self.0.lock().is_some()
    }

    /// Gives the permit back, unless it was taken.
    fn release(&self) {
        // Dropped outside the lock: a release may serve the key's waiters.
        let permit = self.0.lock().take();
        drop(permit);
    }
}

impl<P: fmt::Debug> fmt::Debug for HeldPermit<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HeldPermit").field(&*self.0.lock()).finish()
    }
}

/// Gives a permit back when dropped (unless a handler took it).
struct Release<P>(HeldPermit<P>);

impl<P> Drop for Release<P> {
    fn drop(&mut self) {
        self.0.release();
    }
}

pin_project! {
    /// The body of a response of the
    /// [`ConcurrencyLimitService`](super::ConcurrencyLimitService): the
    /// inner service's body, holding the request's permit until it has
    /// been sent to its end (or fails, or is dropped: a client gone
    /// midway), or a refusal's short text.
    ///
    /// # Examples
    ///
    /// ```
    /// use http_body::Body;
    /// use keyrate::layer::PermitBody;
    ///
    /// let body: PermitBody<String> = PermitBody::default(); // empty, no permit
    /// assert!(body.is_end_stream());
    /// ```
    pub struct PermitBody<B, P = Permit> {
        #[pin]
        inner: B,
        // A refusal's text, sent before `inner` (then the default, empty).
        text: Option<Bytes>,
        // The request's permit, given back at the end or on drop.
        release: Option<Release<P>>,
    }
}

impl<B, P> PermitBody<B, P> {
    /// `inner`, holding `held` until it ends.
    pub(super) fn holding(inner: B, held: HeldPermit<P>) -> Self {
        PermitBody {
            inner,
            text: None,
            release: Some(Release(held)),
        }
    }

    /// A refusal's body: `text`.
    pub(super) fn refused(text: String) -> Self
    where
        B: Default,
    {
        PermitBody {
            inner: B::default(),
            text: Some(Bytes::from(text)),
            release: None,
        }
    }
}

impl<B: Default, P> Default for PermitBody<B, P> {
    fn default() -> Self {
        PermitBody {
            inner: B::default(),
            text: None,
            release: None,
        }
    }
}

impl<B, P> Body for PermitBody<B, P>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        if let Some(text) = this.text.take() {
            return Poll::Ready(Some(Ok(Frame::data(text.into()))));
        }
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        if matches!(frame, None | Some(Err(_))) {
            // The body is over: its permit goes back now, before the
            // connection sends the end (or is torn down).
            this.release.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.text.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        if let Some(text) = &self.text {
            // The upper bound first: a lower bound above it panics.
            let len = text.len() as u64;
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper + len);
            }
            hint.set_lower(hint.lower() + len);
        }
        hint
    }
}

impl<B: fmt::Debug, P> fmt::Debug for PermitBody<B, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitBody")
            .field("inner", &self.inner)
            .field(
                "holds_permit",
                &self.release.as_ref().is_some_and(|r| r.0.is_held()),
            )
            .finish()
    }
}
