//! Console sessions: an opaque id in a cookie, mapped here to who logged in and
//! what they may do. Kept in memory (a restart logs everyone out, which is the
//! safe side), bounded by `[admin.ui] max_sessions`, ended after
//! `session_idle` unused or `session_max` after the login, whichever comes first.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use rand::RngCore as _;

use super::super::auth::{Access, Credential};

/// The cookie's name. `__Host-` would pin it to `Secure` and `Path=/`, which the
/// console over plain HTTP (and under `/ui`) cannot meet.
pub const COOKIE: &str = "outboxd_session";

/// Random bytes in a session id: as many as the admin token carries.
const ID_BYTES: usize = 32;

/// Who a session belongs to.
#[derive(Debug, Clone)]
pub struct Session {
    /// The credential's name, as the audit records it.
    pub who: String,
    /// What the credential may do.
    pub access: Access,
    created: Instant,
    last_used: Instant,
}

impl Session {
    /// Whether it may act (retry, resolve, forget), not only look.
    pub fn can_act(&self) -> bool {
        self.access == Access::Operate
    }
}

/// The live sessions.
pub struct Sessions {
    by_id: Mutex<HashMap<String, Session>>,
    idle: Duration,
    max_age: Duration,
    max_sessions: usize,
}

impl Sessions {
    pub fn new(idle: Duration, max_age: Duration, max_sessions: usize) -> Sessions {
        Sessions { by_id: Mutex::new(HashMap::new()), idle, max_age, max_sessions }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        // A panic under this lock leaves at worst a session too many or too few.
        self.by_id.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts a session for `credential`; answers its id (the cookie's value).
    pub fn start(&self, credential: &Credential, now: Instant) -> String {
        let mut bytes = [0u8; ID_BYTES];
        rand::rng().fill_bytes(&mut bytes);
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let mut all = self.lock();
        all.retain(|_, s| self.live(s, now));
        while all.len() >= self.max_sessions {
            let oldest = all.iter().min_by_key(|(_, s)| s.last_used).map(|(k, _)| k.clone());
            match oldest {
                Some(k) => all.remove(&k),
                None => break,
            };
        }
        let session = Session { who: credential.name.clone(), access: credential.access, created: now, last_used: now };
        all.insert(id.clone(), session);
        id
    }

    /// The session of cookie value `id`, if it is live; using it keeps it alive.
    pub fn touch(&self, id: &str, now: Instant) -> Option<Session> {
        let mut all = self.lock();
        match all.get_mut(id) {
            Some(s) if self.live(s, now) => {
                s.last_used = now;
                Some(s.clone())
            }
            Some(_) => {
                all.remove(id);
                None
            }
            None => None,
        }
    }

    /// Ends a session (logout).
    pub fn end(&self, id: &str) {
        self.lock().remove(id);
    }

    fn live(&self, s: &Session, now: Instant) -> bool {
        now.saturating_duration_since(s.last_used) < self.idle
            && now.saturating_duration_since(s.created) < self.max_age
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Credential {
        Credential::new("alice", Access::Operate)
    }

    #[test]
    fn a_session_ends_when_idle_or_old_and_ids_are_unguessable() {
        let sessions = Sessions::new(Duration::from_secs(60), Duration::from_secs(100), 8);
        let t = Instant::now();
        let a = sessions.start(&alice(), t);
        let b = sessions.start(&alice(), t);
        assert_ne!(a, b);
        assert!(a.len() >= 43, "{a}");
        assert_eq!(sessions.touch(&a, t + Duration::from_secs(50)).unwrap().who, "alice");
        // Used at 50 s: alive at 100 s idle-wise, but older than the maximum.
        assert!(sessions.touch(&a, t + Duration::from_secs(99)).is_some());
        assert!(sessions.touch(&a, t + Duration::from_secs(101)).is_none());
        // b was not used for 61 s.
        assert!(sessions.touch(&b, t + Duration::from_secs(61)).is_none());
        assert!(sessions.touch("forged", t).is_none());
    }

    #[test]
    fn logging_out_ends_the_session_and_the_bound_ends_the_least_used() {
        let sessions = Sessions::new(Duration::from_secs(60), Duration::from_secs(600), 2);
        let t = Instant::now();
        let a = sessions.start(&alice(), t);
        let b = sessions.start(&alice(), t + Duration::from_secs(1));
        sessions.touch(&a, t + Duration::from_secs(2));
        let c = sessions.start(&alice(), t + Duration::from_secs(3));
        assert!(sessions.touch(&b, t + Duration::from_secs(3)).is_none(), "b was the least recently used");
        assert!(sessions.touch(&a, t + Duration::from_secs(3)).is_some());
        sessions.end(&c);
        assert!(sessions.touch(&c, t + Duration::from_secs(3)).is_none());
    }
}
