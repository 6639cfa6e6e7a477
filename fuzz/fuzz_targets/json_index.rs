//! Raw bytes as a JSON text: the structural index against the tape parser (see
//! `recast::fuzzing::json_index`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    recast::fuzzing::json_index(data);
});
