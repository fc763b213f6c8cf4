//! Console sessions: an opaque id in a cookie, mapped here to who logged in and
//! what they may do. Kept in memory (a restart logs everyone out, which is the
//! safe side), ended after `session_idle` unused or `session_max` after the login,
//! whichever comes first. A page a person opens uses its session; a page's own
//! polling (the overview's live part, a job's progress) only looks at it, so a tab
//! left open still ends `session_idle` after its last use.
//!
//! Bounded twice: `[admin.ui] max_sessions_per_credential` per credential (a new login
//! ends that credential's least recently used one), and `max_sessions` in all, where a
//! new login ends the least recently used session of a credential with no more access
//! than its own, and is refused when there is none: logging in again and again with a
//! `read` credential never ends an operator's session.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use rand::RngCore as _;

use super::super::auth::{Access, Credential};
use crate::config::UiConfig;

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
    per_credential: usize,
}

/// A login could not be given a session: every session is taken by credentials with
/// more access than its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl Sessions {
    pub fn new(config: &UiConfig) -> Sessions {
        Sessions {
            by_id: Mutex::new(HashMap::new()),
            idle: config.session_idle,
            max_age: config.session_max,
            max_sessions: config.max_sessions,
            per_credential: config.max_sessions_per_credential,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        // A panic under this lock leaves at worst a session too many or too few.
        self.by_id.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts a session for `credential`; answers its id (the cookie's value), or
    /// [`Full`] when every session belongs to credentials with more access.
    pub fn start(&self, credential: &Credential, now: Instant) -> Result<String, Full> {
        let mut all = self.lock();
        all.retain(|_, s| self.live(s, now));
        // Its own sessions first: one credential cannot take every place.
        let own = |s: &Session| s.who == credential.name;
        while all.values().filter(|s| own(s)).count() >= self.per_credential {
            if !end_least_used(&mut all, own) {
                break;
            }
        }
        let not_above = |s: &Session| rank(s.access) <= rank(credential.access);
        while all.len() >= self.max_sessions {
            if !end_least_used(&mut all, not_above) {
                return Err(Full);
            }
        }
        let mut bytes = [0u8; ID_BYTES];
        rand::rng().fill_bytes(&mut bytes);
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let session = Session { who: credential.name.clone(), access: credential.access, created: now, last_used: now };
        all.insert(id.clone(), session);
        Ok(id)
    }

    /// The session of cookie value `id`, if it is live; a person's use keeps it alive.
    pub fn touch(&self, id: &str, now: Instant) -> Option<Session> {
        self.find(id, now, true)
    }

    /// The session of cookie value `id`, if it is live, without keeping it alive:
    /// for a page's own polling, which is no sign that anyone is there.
    pub fn look(&self, id: &str, now: Instant) -> Option<Session> {
        self.find(id, now, false)
    }

    fn find(&self, id: &str, now: Instant, used: bool) -> Option<Session> {
        let mut all = self.lock();
        match all.get_mut(id) {
            Some(s) if self.live(s, now) => {
                if used {
                    s.last_used = now;
                }
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

/// Ends the least recently used session `which` picks; false when it picks none.
fn end_least_used(all: &mut HashMap<String, Session>, which: impl Fn(&Session) -> bool) -> bool {
    let oldest = all.iter().filter(|(_, s)| which(s)).min_by_key(|(_, s)| s.last_used).map(|(k, _)| k.clone());
    oldest.is_some_and(|k| all.remove(&k).is_some())
}

/// Access, ordered: a session may end others' of no more access than its own.
fn rank(access: Access) -> u8 {
    match access {
        Access::Read => 0,
        Access::Operate => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Credential {
        Credential::new("alice", Access::Operate)
    }

    fn config(idle: u64, max_age: u64, max_sessions: usize, per_credential: usize) -> UiConfig {
        UiConfig {
            session_idle: Duration::from_secs(idle),
            session_max: Duration::from_secs(max_age),
            max_sessions,
            max_sessions_per_credential: per_credential,
            ..UiConfig::default()
        }
    }

    #[test]
    fn a_session_ends_when_idle_or_old_and_ids_are_unguessable() {
        let sessions = Sessions::new(&config(60, 100, 8, 8));
        let t = Instant::now();
        let a = sessions.start(&alice(), t).unwrap();
        let b = sessions.start(&alice(), t).unwrap();
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
        let sessions = Sessions::new(&config(60, 600, 2, 8));
        let t = Instant::now();
        let a = sessions.start(&alice(), t).unwrap();
        let b = sessions.start(&alice(), t + Duration::from_secs(1)).unwrap();
        sessions.touch(&a, t + Duration::from_secs(2));
        let c = sessions.start(&alice(), t + Duration::from_secs(3)).unwrap();
        assert!(sessions.touch(&b, t + Duration::from_secs(3)).is_none(), "b was the least recently used");
        assert!(sessions.touch(&a, t + Duration::from_secs(3)).is_some());
        sessions.end(&c);
        assert!(sessions.touch(&c, t + Duration::from_secs(3)).is_none());
    }

    #[test]
    fn polling_does_not_keep_a_session_alive() {
        let sessions = Sessions::new(&config(60, 600, 8, 8));
        let t = Instant::now();
        let a = sessions.start(&alice(), t).unwrap();
        for s in (10..=50).step_by(10) {
            assert!(sessions.look(&a, t + Duration::from_secs(s)).is_some(), "still live at {s} s");
        }
        assert!(
            sessions.look(&a, t + Duration::from_secs(61)).is_none(),
            "looked at, never used: idle since the login"
        );
    }

    #[test]
    fn one_credential_keeps_at_most_its_share_and_ends_its_own_least_used() {
        let sessions = Sessions::new(&config(60, 600, 100, 2));
        let t = Instant::now();
        let bob = sessions.start(&Credential::new("bob", Access::Operate), t).unwrap();
        let a = sessions.start(&alice(), t).unwrap();
        let b = sessions.start(&alice(), t + Duration::from_secs(1)).unwrap();
        let c = sessions.start(&alice(), t + Duration::from_secs(2)).unwrap();
        let later = t + Duration::from_secs(3);
        assert!(sessions.touch(&a, later).is_none(), "alice's least used session made room");
        assert!(sessions.touch(&b, later).is_some() && sessions.touch(&c, later).is_some());
        assert!(sessions.touch(&bob, later).is_some(), "another credential's session is left alone");
    }

    #[test]
    fn logins_of_a_read_credential_never_end_an_operators_session() {
        let sessions = Sessions::new(&config(60, 600, 2, 8));
        let t = Instant::now();
        let operator = sessions.start(&alice(), t).unwrap();
        let reader = Credential::new("dashboard", Access::Read);
        let first = sessions.start(&reader, t + Duration::from_secs(1)).unwrap();
        // The bound is reached: a read login may end a read session, never an operate one.
        for s in 2..20 {
            assert!(sessions.start(&reader, t + Duration::from_secs(s)).is_ok());
        }
        let later = t + Duration::from_secs(30);
        assert!(sessions.touch(&operator, later).is_some(), "the operator is still logged in");
        assert!(sessions.touch(&first, later).is_none());
        // With only operators' sessions left, a read login is refused.
        let operators = Sessions::new(&config(60, 600, 1, 8));
        let kept = operators.start(&alice(), t).unwrap();
        assert_eq!(operators.start(&reader, t), Err(Full));
        assert!(operators.touch(&kept, t).is_some());
        // An operator's login may end a read session.
        let mixed = Sessions::new(&config(60, 600, 1, 8));
        let read = mixed.start(&reader, t).unwrap();
        assert!(mixed.start(&alice(), t).is_ok());
        assert!(mixed.touch(&read, t).is_none());
    }
}
