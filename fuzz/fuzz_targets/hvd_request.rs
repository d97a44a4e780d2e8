//! hvd's request decoder gets untrusted bytes from every guest.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = pvio_hv::proto::Request::decode(data) {
        // Whatever decodes must re-encode to the same bytes.
        assert_eq!(req.encode(), data);
    }
    let _ = pvio_hv::proto::reply_payload(data);
});
