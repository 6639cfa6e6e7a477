//! See `recast::fuzzing::compose_pages`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    recast::fuzzing::compose_pages(data);
});
