//! Rules JSON → compile → execute on a JSON document (see `recast::fuzzing::rules_then_execute`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    recast::fuzzing::rules_then_execute(data);
});
