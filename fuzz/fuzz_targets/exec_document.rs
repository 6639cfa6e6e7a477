//! See `recast::fuzzing::exec_document`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    recast::fuzzing::exec_document(data);
});
