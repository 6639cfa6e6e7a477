//! Lowercase hexadecimal text: sealed values and cursors in the store, the secret key, and
//! request ids.

/// The hex digits, by value.
pub const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The value of each hex digit by its byte (either case), [`INVALID`] for every other byte: a
/// table, not branches, since a sealed configuration is thousands of random digits.
const VALUES: [u8; 256] = {
    let mut table = [INVALID; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        table[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    table
};
const INVALID: u8 = 0xff;

/// `bytes` as two lowercase digits each.
pub fn encode(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(2 * bytes.len());
    for &b in bytes {
        text.push(char::from(DIGITS[usize::from(b >> 4)]));
        text.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    text
}

/// The bytes that `text` spells, two digits (either case) each; `None` if it is anything else.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let mut bytes = Vec::with_capacity(text.len() / 2);
    let mut invalid = 0;
    for pair in text.as_bytes().chunks_exact(2) {
        let (high, low) = (VALUES[usize::from(pair[0])], VALUES[usize::from(pair[1])]);
        invalid |= (high | low) & 0xf0;
        bytes.push(high << 4 | (low & 0x0f));
    }
    (invalid == 0).then_some(bytes)
}

/// Writes `bytes` as two lowercase digits each into `out` (twice as long).
pub fn write_bytes(out: &mut [u8], bytes: &[u8]) {
    for (byte, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
}

/// Writes the low `4 × out.len()` bits of `n` as lowercase digits, filling `out`.
pub fn write_u64(out: &mut [u8], mut n: u64) {
    for digit in out.iter_mut().rev() {
        *digit = DIGITS[(n & 0xf) as usize];
        n >>= 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_only_hex_decodes() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&bytes)).as_deref(), Some(bytes.as_slice()));
        assert_eq!(encode(&[0x0a, 0xff]), "0aff");
        assert_eq!(decode("0aFf"), Some(vec![0x0a, 0xff]));
        for bad in ["0", "0g", "zz", "0a ", " 0a", "ä0"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn numbers_fill_their_width() {
        let mut out = [0u8; 8];
        write_u64(&mut out, 0xdead_beef);
        assert_eq!(&out, b"deadbeef");
        let mut out = [0u8; 4];
        write_u64(&mut out, 0x1_2345);
        assert_eq!(&out, b"2345", "only the low digits that fit");
    }
}
