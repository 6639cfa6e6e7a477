//! HTTP/1.1 text that both sides of recast write and read: the lane writes answers to clients and
//! the upstream client writes requests and reads answers, each without hyper.

use http::StatusCode;

/// Appends the header line `name: value\r\n`.
pub(crate) fn line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends the line `content-length: {length}\r\n`.
pub(crate) fn content_length(out: &mut Vec<u8>, length: usize) {
    line(out, b"content-length", itoa::Buffer::new().format(length).as_bytes());
}

/// The most memory reserved for a body up front, whatever its declared length: a client or an
/// upstream that announces a large body and never sends it cannot make recast hold memory.
pub(crate) const RESERVE_LIMIT: usize = 1 << 20;

/// Whether an answer with `status` never has a body, whatever its headers say (RFC 9112 §6.3):
/// interim answers, `204 No Content` and `304 Not Modified`.
pub(crate) fn has_no_body(status: StatusCode) -> bool {
    status.is_informational() || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED
}

/// Makes room in `buf` for `additional` more bytes, growing it as `Vec` would (to at least twice
/// its capacity) but never past `most` bytes of capacity: a body read to its limit takes about the
/// limit in memory, not up to twice as much. `most` must leave room for what is being added.
pub(crate) fn reserve_within(buf: &mut Vec<u8>, additional: usize, most: usize) {
    let needed = buf.len() + additional;
    if needed > buf.capacity() {
        let target = needed.max(buf.capacity().saturating_mul(2)).min(most.max(needed));
        buf.reserve_exact(target - buf.len());
    }
}

/// Whether `buf` holds a blank line, the end of a head (`\n\n` or `\n\r\n`), that ends at or after
/// `from`: the readers of heads parse a buffer again only when more bytes brought one, so a head
/// that arrives a byte at a time is parsed once, not once per byte.
pub(crate) fn has_blank_line(buf: &[u8], from: usize) -> bool {
    (from.saturating_sub(2)..buf.len())
        .any(|i| buf[i] == b'\n' && (buf[..i].ends_with(b"\n") || buf[..i].ends_with(b"\n\r")))
}

/// Implements `tokio::io::AsyncWrite` for a stream wrapper `$wrapper<S>` by passing every call on
/// to its field `$field`: the wrappers around a client's stream change only how it is read.
macro_rules! write_through {
    ($wrapper:ident, $field:ident) => {
        impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for $wrapper<S> {
            fn poll_write(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.$field).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.$field).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.$field.is_write_vectored()
            }

            fn poll_flush(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.$field).poll_flush(cx)
            }

            fn poll_shutdown(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.$field).poll_shutdown(cx)
            }
        }
    };
}
pub(crate) use write_through;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_lines_are_found_in_new_bytes_only() {
        let head = b"GET / HTTP/1.1\r\nhost: a\r\n\r\n";
        for end in 0..head.len() {
            assert!(!has_blank_line(&head[..end], 0), "{end}");
        }
        assert!(has_blank_line(head, 0));
        assert!(has_blank_line(head, head.len() - 1), "the last byte completes it");
        assert!(has_blank_line(b"a\n\nb", 2));
        assert!(!has_blank_line(b"a\r\nb\r\n", 0));
    }

    #[test]
    fn lines_and_bodiless_statuses() {
        let mut out = Vec::new();
        line(&mut out, b"content-length", b"12");
        assert_eq!(out, b"content-length: 12\r\n");
        content_length(&mut out, 345);
        assert_eq!(out, b"content-length: 12\r\ncontent-length: 345\r\n");
        for status in [100, 103, 204, 304] {
            assert!(has_no_body(StatusCode::from_u16(status).unwrap()), "{status}");
        }
        for status in [200, 201, 205, 301, 404, 500] {
            assert!(!has_no_body(StatusCode::from_u16(status).unwrap()), "{status}");
        }
    }
}
