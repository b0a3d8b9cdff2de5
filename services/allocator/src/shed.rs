//! Load shedding at the gRPC door (`RUNYARD_ALLOCATOR_MAX_IN_FLIGHT`): a
//! bound on the `Allocator` calls handled at once. A call beyond it is
//! answered `RESOURCE_EXHAUSTED` at once — not queued, so a flood cannot
//! grow the allocator's memory or every caller's wait without limit; the
//! scaler falls back to its first flavor and the CLI reports the code.
//! Health and reflection are not bounded: they stay answerable under load.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::Semaphore;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

/// A gRPC service behind an in-flight bound.
#[derive(Debug, Clone)]
pub struct InFlight<S> {
    inner: S,
    slots: Arc<Semaphore>,
    max: usize,
    /// Calls answered `RESOURCE_EXHAUSTED`.
    shed: Counter,
}

impl<S> InFlight<S> {
    /// `inner`, handling at most `max` calls (at least 1) at once.
    pub fn new(inner: S, max: usize, shed: Counter) -> Self {
        let max = max.max(1);
        Self {
            inner,
            slots: Arc::new(Semaphore::new(max)),
            max,
            shed,
        }
    }
}

impl<S, B, R> Service<http::Request<B>> for InFlight<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            self.shed.inc();
            let status = tonic::Status::resource_exhausted(format!(
                "allocator at capacity ({} calls in flight), retry later",
                self.max
            ));
            return Box::pin(std::future::ready(Ok(status.into_http())));
        };
        // The ready service answers this call; a fresh clone waits for the
        // next (tower's rule for services called from a shared handle).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let answer = inner.call(request).await;
            drop(permit);
            answer
        })
    }
}

impl<S: NamedService> NamedService for InFlight<S> {
    const NAME: &'static str = S::NAME;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    /// A service whose calls each wait for a permit of the semaphore.
    #[derive(Clone)]
    struct Held(Arc<Semaphore>);

    impl Service<http::Request<()>> for Held {
        type Response = http::Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let release = self.0.clone();
            Box::pin(async move {
                release.acquire().await.unwrap().forget();
                Ok(http::Response::new(tonic::body::Body::empty()))
            })
        }
    }

    fn code(r: &http::Response<tonic::body::Body>) -> tonic::Code {
        tonic::Status::from_header_map(r.headers()).map_or(tonic::Code::Ok, |s| s.code())
    }

    #[tokio::test]
    async fn calls_beyond_the_limit_are_answered_resource_exhausted_at_once() {
        let release = Arc::new(Semaphore::new(0));
        let shed = Counter::default();
        let mut svc = InFlight::new(Held(release.clone()), 2, shed.clone());
        let first = tokio::spawn(svc.call(http::Request::new(())));
        let second = tokio::spawn(svc.call(http::Request::new(())));
        // Two in flight: the third is not queued but answered now.
        let third = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            svc.call(http::Request::new(())),
        )
        .await
        .expect("answered at once")
        .unwrap();
        assert_eq!(code(&third), tonic::Code::ResourceExhausted);
        let message = tonic::Status::from_header_map(third.headers())
            .unwrap()
            .message()
            .to_owned();
        assert!(message.contains("2 calls in flight"), "{message}");
        assert_eq!(shed.get(), 1);

        // A finished call gives its slot back.
        release.add_permits(2);
        for call in [first, second] {
            assert_eq!(code(&call.await.unwrap().unwrap()), tonic::Code::Ok);
        }
        let fourth = tokio::spawn(svc.call(http::Request::new(())));
        release.add_permits(1);
        let fourth = tokio::time::timeout(std::time::Duration::from_secs(1), fourth)
            .await
            .expect("admitted and answered")
            .unwrap()
            .unwrap();
        assert_eq!(code(&fourth), tonic::Code::Ok);
        assert_eq!(shed.get(), 1);
    }
}
