//! What one client connection's last credential made (SPEC §2.4 leaves how a credential is
//! found to the implementation): a client on a kept-alive connection sends the same key or
//! token with every call, and the door would digest it again each time (SHA-256 of a key's 46
//! bytes, of a token's several hundred). The connection keeps the last credential it presented
//! and the key entry or verified token it led to; a call presenting the same bytes, compared in
//! constant time (a proxy in front may carry several clients' calls on one connection), takes
//! that entry without the digest and the lookup.
//!
//! Nothing is taken on trust that a lookup would have refused: a key entry the directory has
//! replaced or dropped (a revoked key, a deleted consumer, changed metadata) is marked retired
//! and not taken; a token past its `exp` is not taken; and every check that follows a lookup
//! (the key's expiry, the route's consumers, the token's issuer, key-set generation and claims,
//! the limit) runs on every call as before.

use std::sync::{Arc, Mutex};

use super::certificate::ClientCertificate;
use super::consumers::KeyEntry;
use super::verified::Token;

/// A connection's memory of its last credential, and the client certificate it showed in its
/// handshake (SPEC §7). Calls on one HTTP/1 connection come one at a time; HTTP/2 streams that
/// find it held by another stream go the long way.
#[derive(Default)]
pub struct Memo {
    last: Mutex<Last>,
    certificate: Option<Arc<ClientCertificate>>,
}

#[derive(Default)]
struct Last {
    credential: Vec<u8>,
    made: Made,
}

#[derive(Default)]
enum Made {
    #[default]
    Nothing,
    Key(Arc<KeyEntry>),
    Token(Arc<Token>),
}

impl Memo {
    /// The memory of a connection whose client showed `certificate`, verified.
    pub fn new(certificate: Option<Arc<ClientCertificate>>) -> Memo {
        Memo { last: Mutex::default(), certificate }
    }

    /// The client certificate of the connection, verified by the listener.
    pub fn certificate(&self) -> Option<&ClientCertificate> {
        self.certificate.as_deref()
    }

    /// The key entry `key` led to on this connection, while the directory still holds it.
    pub fn key(&self, key: &[u8]) -> Option<Arc<KeyEntry>> {
        let last = self.last.try_lock().ok()?;
        match &last.made {
            Made::Key(entry) if same(&last.credential, key) && !entry.retired() => Some(entry.clone()),
            _ => None,
        }
    }

    /// The verified token `token` is on this connection, while its `exp` (seconds) is after `now`.
    pub fn token(&self, token: &[u8], now: u64) -> Option<Arc<Token>> {
        let last = self.last.try_lock().ok()?;
        match &last.made {
            Made::Token(known) if same(&last.credential, token) && known.times.exp > now => {
                Some(known.clone())
            }
            _ => None,
        }
    }

    pub fn keep_key(&self, key: &[u8], entry: &Arc<KeyEntry>) {
        self.keep(key, Made::Key(entry.clone()));
    }

    pub fn keep_token(&self, token: &[u8], known: &Arc<Token>) {
        self.keep(token, Made::Token(known.clone()));
    }

    fn keep(&self, credential: &[u8], made: Made) {
        if let Ok(mut last) = self.last.try_lock() {
            last.credential.clear();
            last.credential.extend_from_slice(credential);
            last.made = made;
        }
    }
}

/// Whether two credentials are the same bytes, in a time that does not depend on where they
/// differ (only on their lengths): the differences of every byte are gathered with no branch on
/// them, and the optimiser is kept from reasoning about the result before the end (the idiom of
/// the `constant_time_eq` crate; `subtle` goes a byte at a time behind a barrier each, several
/// instructions a byte, thousands for a token). The 64-byte turns compile to vector operations
/// (SSE2 on any x86-64): about 19 instructions per 64 bytes.
fn same(kept: &[u8], given: &[u8]) -> bool {
    if kept.len() != given.len() {
        return false;
    }
    let (kept_blocks, kept_rest) = kept.as_chunks::<64>();
    let (given_blocks, given_rest) = given.as_chunks::<64>();
    let mut lanes = [0u8; 64];
    for (a, b) in kept_blocks.iter().zip(given_blocks) {
        for i in 0..64 {
            lanes[i] |= a[i] ^ b[i];
        }
    }
    let mut differ = 0u8;
    for (a, b) in kept_rest.iter().zip(given_rest) {
        differ |= a ^ b;
    }
    let folded =
        lanes.as_chunks::<8>().0.iter().fold(u64::from(differ), |all, word| all | u64::from_ne_bytes(*word));
    std::hint::black_box(folded) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_the_same_only_when_every_byte_is() {
        // Lengths that end in each part of the comparison: 64-byte blocks, 16-byte words, an
        // 8-byte word, bytes.
        for length in [0, 1, 7, 8, 15, 16, 23, 24, 31, 46, 49, 63, 64, 65, 88, 700] {
            let token: Vec<u8> = (0..length).map(|i| b'a' + (i * 7 % 26) as u8).collect();
            assert!(same(&token, &token.clone()));
            for at in 0..length {
                for bit in [0x01, 0x80] {
                    let mut other = token.clone();
                    other[at] ^= bit;
                    assert!(!same(&token, &other), "a difference at byte {at} of {length} was missed");
                }
            }
            if length > 0 {
                assert!(!same(&token, &token[..length - 1]));
            }
        }
    }

    #[test]
    fn a_kept_key_answers_for_its_own_bytes_until_the_directory_lets_it_go() {
        use super::super::consumers::{Directory, StoredConsumer, issue};
        let (a, b) = (issue(1, None), issue(1, None));
        let consumer = |keys| StoredConsumer {
            name: "app".into(),
            metadata: serde_json::json!({}),
            created_at: 1,
            updated_at: 1,
            keys,
        };
        let directory = Directory::default();
        directory.put(consumer(vec![a.stored.clone(), b.stored.clone()]));
        let memo = Memo::default();
        assert!(memo.key(a.key.as_bytes()).is_none(), "nothing kept yet");
        memo.keep_key(a.key.as_bytes(), &directory.find(a.key.as_bytes()).unwrap());
        assert!(memo.key(a.key.as_bytes()).is_some());
        assert!(memo.key(b.key.as_bytes()).is_none(), "another key is looked up");
        assert!(memo.token(a.key.as_bytes(), 0).is_none(), "a key is no token");
        // `a` revoked: the entry kept is not taken any more.
        directory.put(consumer(vec![b.stored.clone()]));
        assert!(memo.key(a.key.as_bytes()).is_none());
    }
}
