//! Plain-path expressions read through the plan's scans against the same paths run as programs
//! (see `recast::fuzzing::plain_paths`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    recast::fuzzing::plain_paths(data);
});
