//! Retries counted once, in process: the memory backend's twin of the scripts' `seen_before`
//! and `remember`.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use crate::backend::answer::Answer;
use crate::client_id::{ClientId, ClientIds};

/// First answers by request key, until their window ends; bounded: when full, expired answers
/// go first, then any (a forgotten request would be counted again, as without an id).
#[derive(Debug)]
pub(crate) struct Recent {
    answers: Mutex<HashMap<ClientId, (Vec<Answer>, u64)>>,
    ids: ClientIds,
    max_keys: usize,
}

impl Recent {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            answers: Mutex::default(),
            ids: ClientIds::default(),
            max_keys,
        }
    }

    /// The first answer to the request at `key` within `window_ms` of `now_us` and `true`
    /// (a retry), or `check`'s, remembered, and `false`. Checks with an id are serialized here, so two concurrent retries of one
    /// request never both consume.
    pub(crate) fn once(
        &self,
        key: &str,
        window_ms: u64,
        now_us: u64,
        check: impl FnOnce() -> Vec<Answer>,
    ) -> (Vec<Answer>, bool) {
        let mut answers = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
        let id = self.ids.id(key);
        if let Some((first, _)) = answers.get(&id).filter(|(_, until)| *until > now_us) {
            return (first.clone(), true);
        }
        if answers.len() >= self.max_keys {
            answers.retain(|_, (_, until)| *until > now_us);
            if answers.len() >= self.max_keys
                && let Some(any) = answers.keys().next().copied()
            {
                answers.remove(&any);
            }
        }
        let first = check();
        let until = now_us.saturating_add(window_ms.saturating_mul(1000));
        answers.insert(id, (first.clone(), until));
        (first, false)
    }

    /// Moves the remaining of each admitting answer remembered at `key` by `delta`, never
    /// below 0: a retry of a settled reservation is answered what is left after the settle.
    pub(crate) fn resettle(&self, key: &str, delta: i64) {
        let mut answers = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((first, _)) = answers.get_mut(&self.ids.id(key)) else {
            return;
        };
        for answer in first.iter_mut().filter(|a| a.denial.is_none()) {
            let moved = i128::from(answer.view.remaining) + i128::from(delta);
            answer.view.remaining = u64::try_from(moved.max(0)).unwrap_or(u64::MAX);
        }
    }
}
