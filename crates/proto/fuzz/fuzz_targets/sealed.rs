//! The receiving steps of sealed groups on arbitrary bytes: the sealed
//! fields, and a receiver that holds the epoch key of whatever cell and
//! epoch the input names (so the AEAD open is reached), fed the input twice
//! (the second time a replay or the same refusal). None may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reflector_proto::sealed::{sealed_fields, MasterSecret, Receiver};

fuzz_target!(|data: &[u8]| {
    let master = MasterSecret::new(&[0x5a; 32]).expect("32 bytes");
    let mut receiver = Receiver::new(4);
    if let Ok(f) = sealed_fields(data) {
        receiver.add_epoch_key(master.epoch_key(f.cell, f.epoch));
    }
    for _ in 0..2 {
        let mut copy = data.to_vec();
        if let Ok(game) = receiver.receive(&mut copy) {
            let _ = &copy[game];
        }
    }
});
