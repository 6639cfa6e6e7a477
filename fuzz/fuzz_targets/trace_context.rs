//! See `recast::fuzzing::trace_context`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    recast::fuzzing::trace_context(data);
});
