//! See `recast::fuzzing::compose_render`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    recast::fuzzing::compose_render(data);
});
