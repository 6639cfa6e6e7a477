//! See `recast::fuzzing::compose_compile`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    recast::fuzzing::compose_compile(data);
});
