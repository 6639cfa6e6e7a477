//! Member names looked up by what identifies them cheaply: a table from the names an object's
//! reader wants to their slots ([`KeyTable`]), which the plan's scans and the on-demand reader's
//! wants share, and the words that identify a short name ([`words`]).

use std::fmt;

/// Where a wanted member goes: a slot of the plan's scans, a place of the on-demand reader's.
pub type Slot = u32;

/// Lookup from member name to slot for one scan: open addressing over a power-of-two table,
/// at most half full, so a name that is not wanted usually costs one hash and one probe.
///
/// Each entry keeps the name's length and its first and last eight bytes ([`words`]). Those
/// determine a name of up to 16 bytes completely, so most comparisons are two integer compares;
/// longer names are compared in full after the words match.
///
/// The hash is keyed by a secret drawn once per process, and takes every byte of a longer name:
/// names chosen to collide (the same first and last bytes, or words that cancel out in a fixed
/// mix) spread like any others, so no rules can make building or probing a table quadratic.
#[derive(Clone)]
pub struct KeyTable {
    mask: usize,
    /// The process's hash key, kept beside the entries it places.
    key: (u64, u64),
    entries: Box<[Entry]>,
    /// All names, back to back; entries point into it.
    names: Box<[u8]>,
    len: usize,
}

#[derive(Clone, Copy)]
struct Entry {
    head: u64,
    tail: u64,
    start: u32,
    len: u32,
    /// `EMPTY` for a free entry.
    slot: Slot,
}

const EMPTY: Slot = Slot::MAX;

impl KeyTable {
    /// Builds the table; names must be distinct.
    pub fn new(names: &[(&str, Slot)]) -> KeyTable {
        KeyTable::keyed(names, process_key())
    }

    /// [`KeyTable::new`] with the hash key given.
    fn keyed(names: &[(&str, Slot)], key: (u64, u64)) -> KeyTable {
        let size = (names.len() * 2).next_power_of_two().max(4);
        let free = Entry { head: 0, tail: 0, start: 0, len: 0, slot: EMPTY };
        let mut table = KeyTable {
            mask: size - 1,
            key,
            entries: vec![free; size].into_boxed_slice(),
            names: names.iter().flat_map(|(n, _)| n.bytes()).collect(),
            len: names.len(),
        };
        let mut start = 0;
        for &(name, slot) in names {
            let (head, tail) = words(name.as_bytes());
            let mut i = hash(table.key, name.as_bytes(), head, tail) & table.mask;
            while table.entries[i].slot != EMPTY {
                i = (i + 1) & table.mask;
            }
            table.entries[i] = Entry { head, tail, start: start as u32, len: name.len() as u32, slot };
            start += name.len();
        }
        table
    }

    /// The slot of member `name`, if this scan wants it.
    pub fn get(&self, name: &[u8]) -> Option<Slot> {
        let (head, tail) = words(name);
        self.get_words(name, head, tail)
    }

    /// [`KeyTable::get`] for a name whose [`words`] are known.
    #[inline(always)]
    pub fn get_words(&self, name: &[u8], head: u64, tail: u64) -> Option<Slot> {
        let mut i = hash(self.key, name, head, tail) & self.mask;
        loop {
            let entry = self.entries.get(i)?;
            if entry.slot == EMPTY {
                return None;
            }
            if entry.head == head && entry.tail == tail && entry.len as usize == name.len() {
                if name.len() <= 16 {
                    return Some(entry.slot);
                }
                let start = entry.start as usize;
                if self.names.get(start..start + name.len()) == Some(name) {
                    return Some(entry.slot);
                }
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Number of names in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the table names no member.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `(name, slot)` pairs in slot order.
    pub fn names(&self) -> Vec<(&str, Slot)> {
        let mut out: Vec<_> = self
            .entries
            .iter()
            .filter(|e| e.slot != EMPTY)
            .map(|e| {
                let bytes = &self.names[e.start as usize..(e.start + e.len) as usize];
                (std::str::from_utf8(bytes).unwrap_or("?"), e.slot)
            })
            .collect();
        out.sort_by_key(|&(_, slot)| slot);
        out
    }
}

#[cfg(test)]
impl KeyTable {
    /// The most entries a lookup of one of its names walks.
    fn longest_probe(&self) -> usize {
        self.names()
            .into_iter()
            .map(|(name, slot)| {
                let (head, tail) = words(name.as_bytes());
                let mut i = hash(self.key, name.as_bytes(), head, tail) & self.mask;
                let mut probes = 1;
                while self.entries[i].slot != slot {
                    i = (i + 1) & self.mask;
                    probes += 1;
                }
                probes
            })
            .max()
            .unwrap_or(0)
    }
}

impl fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.names()).finish()
    }
}

/// Two words that, with the length, identify a name of up to 16 bytes: the first and the last
/// eight bytes (overlapping for shorter names; four-byte halves below eight; the bytes themselves
/// below four).
#[inline(always)]
pub fn words(name: &[u8]) -> (u64, u64) {
    if let (Some(head), Some(tail)) = (name.first_chunk::<8>(), name.last_chunk::<8>()) {
        (u64::from_le_bytes(*head), u64::from_le_bytes(*tail))
    } else if let (Some(head), Some(tail)) = (name.first_chunk::<4>(), name.last_chunk::<4>()) {
        (u64::from(u32::from_le_bytes(*head)), u64::from(u32::from_le_bytes(*tail)))
    } else {
        match *name {
            [a] => (u64::from(a) * 0x01_01_01, 0),
            [a, b] => (u64::from(a) | (u64::from(b) * 0x01_01_00), 0),
            [a, b, c] => (u64::from(a) | (u64::from(b) << 8) | (u64::from(c) << 16), 0),
            _ => (0, 0),
        }
    }
}

/// The hash of a name (its words given): its words and length, and for a name longer than 16
/// bytes every eight bytes between them, each folded through a 128-bit multiply with `key`.
#[inline(always)]
fn hash(key: (u64, u64), name: &[u8], head: u64, tail: u64) -> usize {
    let mut mixed = fold(head ^ key.0, tail ^ key.1 ^ name.len() as u64);
    if name.len() > 16 {
        // Odd: an even multiplier (the key's odd word xored with this odd constant) drops the
        // low bits of the product.
        let middle = (key.0 ^ 0x9E37_79B9_7F4A_7C15) | 1;
        for chunk in name[8..name.len() - 8].chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            mixed = fold(mixed ^ u64::from_le_bytes(word), middle);
        }
        // One more round: names that differ only in a few bytes of the middle (the digits of
        // `item000123…`) came out of one multiply too alike in the low bits that pick an entry,
        // for about one key in a hundred.
        mixed = fold(mixed ^ key.1, middle);
    }
    mixed as usize
}

/// The high and low halves of `a * b`, xored: a multiply that lets every bit of each reach
/// every bit of the result.
#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

/// The key of every table's hash in this process, drawn once from the system's randomness.
fn process_key() -> (u64, u64) {
    static KEY: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();
    *KEY.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let draw = |n: u64| {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(n);
            // Odd, so that a multiply by it loses no bit.
            hasher.finish() | 1
        };
        (draw(1), draw(2))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_table_finds_every_name_and_nothing_else() {
        let names: Vec<String> = (1..=20)
            .flat_map(|i| [format!("strIngredient{i}"), format!("strMeasure{i}")])
            .chain(["a", "ab", "abc", "", "idMeal", "ünï"].map(String::from))
            .collect();
        let pairs: Vec<(&str, Slot)> =
            names.iter().enumerate().map(|(i, n)| (n.as_str(), i as Slot)).collect();
        let table = KeyTable::new(&pairs);
        for (name, slot) in &pairs {
            assert_eq!(table.get(name.as_bytes()), Some(*slot), "{name}");
        }
        let long = "a fairly long member name, longer than sixteen bytes";
        let table = KeyTable::new(&[(long, 0), ("strIngredient1", 1)]);
        assert_eq!(table.get(long.as_bytes()), Some(0));
        let same_words = "a fairly long member name. longer than sixteen bytes";
        assert_eq!(table.get(same_words.as_bytes()), None, "equal head, tail and length, different middle");
        let table = KeyTable::new(&pairs);
        for other in ["strIngredient21", "strMeasure0", "b", "abcd", "IdMeal", "x".repeat(100).as_str()] {
            assert_eq!(table.get(other.as_bytes()), None, "{other}");
        }
        assert_eq!(table.len(), pairs.len());
    }

    #[test]
    fn names_of_every_short_length_are_told_apart() {
        // Every string over {a, b} of up to 9 bytes: lengths around each packing boundary.
        let names: Vec<String> = (0..=9)
            .flat_map(|n| {
                (0..1u32 << n)
                    .map(move |bits| (0..n).map(|i| if bits >> i & 1 == 1 { 'b' } else { 'a' }).collect())
            })
            .collect();
        let pairs: Vec<(&str, Slot)> =
            names.iter().enumerate().map(|(i, n)| (n.as_str(), i as Slot)).collect();
        let table = KeyTable::new(&pairs);
        for (name, slot) in &pairs {
            assert_eq!(table.get(name.as_bytes()), Some(*slot), "{name:?}");
        }
        assert_eq!(table.get(b"c"), None);
        assert_eq!(table.get(b"aaaaaaaaaa"), None);
    }

    /// Names made to collide under a fixed mix of their first and last words (the same words
    /// with different middles; words that cancel out) spread over the table like any others.
    #[test]
    fn names_made_to_collide_do_not() {
        let middles: Vec<String> = (0..20_000).map(|n| format!("aaaaaaaa{n:06}zzzzzzzz")).collect();
        // 16-byte names whose last word turned by 29 bits is their first: a fixed mix of the
        // first word with the last so turned gives them all one hash.
        let cancelling: Vec<String> = (0..u64::MAX)
            .map(|n| {
                let head = u64::from_le_bytes(std::array::from_fn(|i| b'a' + ((n >> (5 * i)) % 26) as u8));
                let mut bytes = head.to_le_bytes().to_vec();
                bytes.extend_from_slice(&head.rotate_right(29).to_le_bytes());
                bytes
            })
            .filter_map(|bytes| String::from_utf8(bytes).ok().filter(|s| s.is_ascii()))
            .take(3_000)
            .collect();
        // The process's key, and one under which the hash before its last round gave the middles
        // a cluster of 72 entries (a key drawn at random: about one in a hundred did so).
        let keys = [process_key(), (0x8f54_f8ce_acaa_b39f, 0xfec3_f6b3_2e8d_4b8b)];
        for (names, key) in
            [middles, cancelling].into_iter().flat_map(|names| keys.map(|key| (names.clone(), key)))
        {
            let mut unique = names.clone();
            unique.sort();
            unique.dedup();
            let pairs: Vec<(&str, Slot)> =
                unique.iter().enumerate().map(|(i, n)| (n.as_str(), i as Slot)).collect();
            let table = KeyTable::keyed(&pairs, key);
            for (name, slot) in &pairs {
                assert_eq!(table.get(name.as_bytes()), Some(*slot));
            }
            assert!(table.longest_probe() < 40, "a cluster of {} entries", table.longest_probe());
        }
    }
}
