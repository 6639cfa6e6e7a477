//! See `recast::fuzzing::http_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    recast::fuzzing::http_request(data);
});
