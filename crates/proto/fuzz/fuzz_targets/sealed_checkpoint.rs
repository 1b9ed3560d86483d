//! A joiner's checks of sealed checkpoints on arbitrary bytes: the joiner
//! holds the epoch key of whatever cell and epoch the input names and the
//! REPLY agrees with its header, so every check up to the certificate is
//! reached (beyond it only with a certificate of the harness's control key,
//! which the unit tests' property test covers). None may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reflector_proto::sealed::checkpoint::{field, open_checkpoint, ControlSigner, FetchedReply, JoinerView};
use reflector_proto::sealed::{CellId, MasterSecret, WorldId};

fuzz_target!(|data: &[u8]| {
    let master = MasterSecret::new(&[0x5a; 32]).expect("32 bytes");
    let control = ControlSigner::derive(&master, WorldId::from_name("fuzz"));
    let public = control.public_key();
    let mut keys = Vec::new();
    let mut reply = FetchedReply {
        tick: 0,
        from_player: 0,
        age_ms: 0,
        received_unix_ms: 0,
    };
    if data.len() >= field::STATE {
        let mut cell = [0u8; 8];
        cell.copy_from_slice(&data[field::CELL]);
        let epoch = u32::from_be_bytes(data[field::EPOCH].try_into().expect("4 bytes"));
        keys.push(master.epoch_key(CellId(cell), epoch));
        reply.tick = u64::from_be_bytes(data[field::TICK].try_into().expect("8 bytes"));
        reply.from_player = u32::from_be_bytes(data[field::PLAYER].try_into().expect("4 bytes"));
    }
    let mut copy = data.to_vec();
    let view = JoinerView {
        control_public: &public,
        group_keys: &keys,
    };
    if let Ok(o) = open_checkpoint(&mut copy, &reply, &view) {
        let _ = &copy[o.state];
    }
});
