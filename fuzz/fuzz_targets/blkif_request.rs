//! A blkif request slot (and its indirect pages) comes from an untrusted
//! frontend; the backend parses it once.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    pvio_blk::request::fuzz_parse(data);
});
