//! Records per state (of one slice), kept as records change, so the service's
//! gauges never scan the store. Persisted in the meta tree with every group
//! commit (`slices`); a crash can leave them off by the writes of the batch that
//! was being committed, and `outboxd store stats` on a stopped service recounts
//! and stores the truth.

use std::sync::atomic::{AtomicI64, Ordering};

use super::record::State;

/// How many states are counted (in [`State::ALL`]'s order).
pub const STATES: usize = State::ALL.len();

#[derive(Debug, Default)]
pub struct Counts([AtomicI64; STATES]);

pub fn slot(state: State) -> usize {
    match state {
        State::Claimed => 0,
        State::Done => 1,
        State::Dead => 2,
        State::Parked => 3,
        State::Held => 4,
    }
}

impl Counts {
    pub fn from_values(values: [i64; STATES]) -> Counts {
        Counts(values.map(AtomicI64::new))
    }

    /// A record left `from` (`None`: it is new) for `to` (`None`: it was removed).
    pub fn moved(&self, from: Option<State>, to: Option<State>) {
        if from == to {
            return;
        }
        if let Some(s) = from {
            self.0[slot(s)].fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(s) = to {
            self.0[slot(s)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// claimed, done, dead, parked, held.
    pub fn values(&self) -> [i64; STATES] {
        std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed))
    }

    /// Records in all states (a count that drifted below zero counts as none).
    pub fn total(&self) -> u64 {
        self.values().iter().map(|n| (*n).max(0) as u64).sum()
    }

    pub fn set(&self, values: [i64; STATES]) {
        for (a, v) in self.0.iter().zip(values) {
            a.store(v, Ordering::Relaxed);
        }
    }

    /// Five big-endian i64: claimed, done, dead, parked, held.
    pub fn encode(&self) -> [u8; 8 * STATES] {
        let mut out = [0u8; 8 * STATES];
        for (chunk, v) in out.chunks_exact_mut(8).zip(self.values()) {
            chunk.copy_from_slice(&v.to_be_bytes());
        }
        out
    }

    /// Also reads the four counts of stores written before `held` (none of them held).
    pub fn decode(bytes: &[u8]) -> Option<[i64; STATES]> {
        if bytes.len() != 8 * STATES && bytes.len() != 8 * (STATES - 1) {
            return None;
        }
        let mut values = [0i64; STATES];
        for (v, chunk) in values.iter_mut().zip(bytes.chunks_exact(8)) {
            *v = i64::from_be_bytes(chunk.try_into().expect("8-byte chunk"));
        }
        Some(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_and_round_trip() {
        let c = Counts::default();
        c.moved(None, Some(State::Claimed));
        c.moved(None, Some(State::Claimed));
        c.moved(Some(State::Claimed), Some(State::Done));
        c.moved(Some(State::Done), Some(State::Done));
        c.moved(None, Some(State::Dead));
        c.moved(Some(State::Dead), None);
        c.moved(None, Some(State::Parked));
        c.moved(None, Some(State::Held));
        c.moved(None, Some(State::Held));
        c.moved(Some(State::Held), Some(State::Claimed));
        assert_eq!(c.values(), [2, 1, 0, 1, 1]);
        assert_eq!(Counts::decode(&c.encode()), Some(c.values()));
        assert_eq!(Counts::decode(&c.encode()[..32]), Some([2, 1, 0, 1, 0]), "a store from before held");
        assert_eq!(Counts::decode(b"short"), None);
    }
}
