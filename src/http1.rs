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

/// Whether an answer with `status` never has a body, whatever its headers say (RFC 9112 §6.3):
/// interim answers, `204 No Content` and `304 Not Modified`.
pub(crate) fn has_no_body(status: StatusCode) -> bool {
    status.is_informational() || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED
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
    fn lines_and_bodiless_statuses() {
        let mut out = Vec::new();
        line(&mut out, b"content-length", b"12");
        assert_eq!(out, b"content-length: 12\r\n");
        for status in [100, 103, 204, 304] {
            assert!(has_no_body(StatusCode::from_u16(status).unwrap()), "{status}");
        }
        for status in [200, 201, 205, 301, 404, 500] {
            assert!(!has_no_body(StatusCode::from_u16(status).unwrap()), "{status}");
        }
    }
}
