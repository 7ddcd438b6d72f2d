use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use crate::Decisions;

/// The check of a [`GuardedLimiter`](crate::GuardedLimiter): a future of its [`Decisions`] that
/// may already be decided.
///
/// The memory backend, a local block and an open circuit decide when the check is made, with no
/// wait: [`into_ready`](Self::into_ready) hands those decisions over at once, so a caller (the
/// tower layer) can act on them without keeping a future. A check that waits for Redis is
/// decided when awaited. Either way, whatever was consumed is consumed; dropping a waiting check
/// may leave its request counted or not, as Redis had it when the check was dropped.
#[must_use = "a waiting check does nothing unless awaited"]
pub struct Check {
    state: State,
}

enum State {
    Ready(Option<Decisions>),
    Waiting(Pin<Box<dyn Future<Output = Decisions> + Send>>),
}

impl Check {
    pub(crate) fn ready(decisions: Decisions) -> Self {
        Self {
            state: State::Ready(Some(decisions)),
        }
    }

    pub(crate) fn waiting(future: impl Future<Output = Decisions> + Send + 'static) -> Self {
        Self {
            state: State::Waiting(Box::pin(future)),
        }
    }

    /// The decisions if the check is already decided, else the check to await.
    ///
    /// # Errors
    /// The check itself, when it waits for the backend.
    pub fn into_ready(self) -> Result<Decisions, Self> {
        match self.state {
            State::Ready(Some(decisions)) => Ok(decisions),
            state => Err(Self { state }),
        }
    }
}

impl Future for Check {
    type Output = Decisions;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Decisions> {
        match &mut self.state {
            State::Ready(decisions) => Poll::Ready(
                decisions
                    .take()
                    .expect("a check polled after it was decided"),
            ),
            State::Waiting(future) => future.as_mut().poll(cx),
        }
    }
}

impl fmt::Debug for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Ready(_) => "ready",
            State::Waiting(_) => "waiting",
        };
        f.debug_struct("Check").field("state", &state).finish()
    }
}
