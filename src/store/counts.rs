//! Records per state (of one slice), kept as records change, so the service's
//! gauges never scan the store. Persisted in the meta tree with every group
//! commit (`slices`); a crash can leave them off by the writes of the batch that
//! was being committed, and `outboxd store stats` on a stopped service recounts
//! and stores the truth.

use std::sync::atomic::{AtomicI64, Ordering};

use super::State;

#[derive(Debug, Default)]
pub struct Counts([AtomicI64; 4]);

fn slot(state: State) -> usize {
    match state {
        State::Claimed => 0,
        State::Done => 1,
        State::Dead => 2,
        State::Parked => 3,
    }
}

impl Counts {
    pub fn from_values(values: [i64; 4]) -> Counts {
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

    /// claimed, done, dead, parked.
    pub fn values(&self) -> [i64; 4] {
        [0, 1, 2, 3].map(|i| self.0[i].load(Ordering::Relaxed))
    }

    pub fn set(&self, values: [i64; 4]) {
        for (a, v) in self.0.iter().zip(values) {
            a.store(v, Ordering::Relaxed);
        }
    }

    /// Four big-endian i64: claimed, done, dead, parked.
    pub fn encode(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (chunk, v) in out.chunks_exact_mut(8).zip(self.values()) {
            chunk.copy_from_slice(&v.to_be_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<[i64; 4]> {
        let bytes: &[u8; 32] = bytes.try_into().ok()?;
        let mut values = [0i64; 4];
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
        assert_eq!(c.values(), [1, 1, 0, 1]);
        assert_eq!(Counts::decode(&c.encode()), Some(c.values()));
        assert_eq!(Counts::decode(b"short"), None);
    }
}
