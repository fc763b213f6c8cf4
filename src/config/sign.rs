//! `[handlers.sign]`: Standard Webhooks signatures on an HTTP handler's calls.

use base64::Engine as _;
use serde::Deserialize;

use super::values::expand_env;
use super::ConfigError;

/// Shortest key accepted: the Standard Webhooks specification asks for 24 to 64
/// bytes (the platforms that mint `whsec_` secrets give 24 or 32).
const MIN_KEY_BYTES: usize = 24;
/// Longest key accepted: more adds nothing to HMAC-SHA256 (longer keys are hashed).
const MAX_KEY_BYTES: usize = 64;
/// Earlier secrets still signing (a rotation in progress): each adds a signature to
/// every call; receivers rotate one secret at a time.
const MAX_PREVIOUS: usize = 4;

/// `[handlers.sign]` as written.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSign {
    /// `handlers[].sign.scheme`: `standard-webhooks`.
    pub scheme: SignScheme,
    /// `handlers[].sign.secret`: `whsec_` and the base64 of the key, `${VAR}` allowed.
    pub secret: String,
    /// `handlers[].sign.previous`: secrets being rotated out; each signs too.
    #[serde(default)]
    pub previous: Vec<String>,
}

/// How calls are signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub enum SignScheme {
    /// The Standard Webhooks specification: `webhook-id`, `webhook-timestamp` and
    /// `webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.
    #[serde(rename = "standard-webhooks")]
    StandardWebhooks,
}

/// `[handlers.sign]`, validated: the keys decoded. `Debug` shows how many, not them.
#[derive(Clone)]
#[non_exhaustive]
pub struct SignConfig {
    /// The scheme (only `standard-webhooks` so far).
    pub scheme: SignScheme,
    /// The current key first, then the previous ones.
    keys: Vec<Vec<u8>>,
}

impl SignConfig {
    /// The keys that sign each call: the current one first.
    pub fn keys(&self) -> &[Vec<u8>] {
        &self.keys
    }
}

impl std::fmt::Debug for SignConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignConfig").field("scheme", &self.scheme).field("keys", &self.keys.len()).finish()
    }
}

impl RawSign {
    /// Validated for handler `at`; `env` resolves `${VAR}`.
    pub(super) fn validate(&self, at: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<SignConfig, ConfigError> {
        if self.previous.len() > MAX_PREVIOUS {
            return Err(ConfigError::field(
                format!("{at}.sign.previous"),
                format!("at most {MAX_PREVIOUS} earlier secrets, got {}", self.previous.len()),
            ));
        }
        let mut keys = vec![key(&format!("{at}.sign.secret"), &self.secret, env)?];
        for (i, previous) in self.previous.iter().enumerate() {
            keys.push(key(&format!("{at}.sign.previous[{i}]"), previous, env)?);
        }
        Ok(SignConfig { scheme: self.scheme, keys })
    }
}

/// A `whsec_…` secret's key. The error never shows the secret.
fn key(field: &str, written: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Vec<u8>, ConfigError> {
    let secret = expand_env(field, written, env)?;
    let encoded = secret.trim().strip_prefix("whsec_").unwrap_or(secret.trim());
    let key = base64::engine::general_purpose::STANDARD.decode(encoded).map_err(|_| {
        ConfigError::field(
            field,
            "not a Standard Webhooks secret: `whsec_` and the base64 of the key (the secret is not shown)",
        )
    })?;
    if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&key.len()) {
        return Err(ConfigError::field(
            field,
            format!(
                "the key is {} bytes; the Standard Webhooks specification asks for {MIN_KEY_BYTES} to {MAX_KEY_BYTES} \
                 (e.g. `whsec_` and the output of `openssl rand -base64 32`)",
                key.len()
            ),
        ));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::super::testing::err;

    fn signed(sign: &str) -> String {
        format!("[[handlers]]\ntopics=[\"a\"]\nkind=\"http\"\nurl=\"http://h/x\"\n[handlers.sign]\n{sign}\n")
    }

    #[test]
    fn a_secret_that_is_not_whsec_base64_of_24_to_64_bytes_is_refused_without_showing_it() {
        let e = err(&signed("scheme = \"standard-webhooks\"\nsecret = \"whsec_not base64!\""));
        assert!(e.contains("handlers[0].sign.secret") && e.contains("base64") && !e.contains("not base64!"), "{e}");
        let e = err(&signed("scheme = \"standard-webhooks\"\nsecret = \"whsec_c2hvcnQ=\""));
        assert!(e.contains("handlers[0].sign.secret") && e.contains("5 bytes") && e.contains("24 to 64"), "{e}");
        let e = err(&signed(
            "scheme = \"standard-webhooks\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\nprevious = [\"x\"]",
        ));
        assert!(e.contains("handlers[0].sign.previous[0]"), "{e}");
        let e = err(&signed("scheme = \"standard-webhooks\"\nsecret = \"${WHSEC_UNSET}\""));
        assert!(e.contains("handlers[0].sign.secret") && e.contains("WHSEC_UNSET"), "{e}");
    }

    #[test]
    fn only_known_schemes_and_only_on_http() {
        let e = err(&signed("scheme = \"hmac\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\""));
        assert!(e.contains("standard-webhooks"), "{e}");
        let e = err("[[handlers]]\ntopics=[\"a\"]\nkind=\"log\"\n[handlers.sign]\nscheme = \"standard-webhooks\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n");
        assert!(e.contains("handlers[0].sign: only valid for kind = \"http\""), "{e}");
    }
}
