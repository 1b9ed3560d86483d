//! The map layouts of `ebpf/fanout.h`, as `#[repr(C)]` structs the loader
//! hands to the kernel byte for byte. Each size is checked here against the
//! C side's `_Static_assert`s, so a field added on one side only fails the
//! build instead of shifting every field after it.
#![allow(unsafe_code)]

/// `FANOUT_MAX_MEMBERS`: the largest group the kernel path serves.
pub const MAX_MEMBERS: usize = 1024;
/// `GROUP_TAGS`, `GROUP_PASS_UP`.
pub const GROUP_TAGS: u32 = 1;
pub const GROUP_PASS_UP: u32 = 2;

/// `struct fanout_dest`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dest {
    /// Network order, as in the packet.
    pub ip: u32,
    pub port: u16,
    pub pad: u16,
    pub ifindex: u32,
    /// Source address of the copy (network order).
    pub sip: u32,
    pub dmac: [u8; 6],
    pub smac: [u8; 6],
}

/// `struct fanout_group`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GroupValue {
    pub id: u32,
    pub flags: u32,
    pub count: u32,
    /// The group socket's address (network order), 0 for any.
    pub addr: u32,
    /// Each member's DATA cap, packets and bytes per second (0: none).
    pub pps: u32,
    pub bps: u32,
    pub dest: [Dest; MAX_MEMBERS],
}

/// `struct fanout_member_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MemberKey {
    pub ip: u32,
    pub port: u16,
    pub group: u16,
}

/// `struct fanout_member`; `lock` is the program's `bpf_spin_lock`, zero
/// when user space writes the value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemberValue {
    pub lock: u32,
    pub player: u32,
    pub membership: u32,
    pub pad: u32,
    pub k0: u64,
    pub k1: u64,
    pub highest: u64,
    pub bitmap: u64,
    pub data_in: u64,
    /// Token buckets in 1e-9 units, and their last refill (kernel ns).
    pub rate_pkts: u64,
    pub rate_bytes: u64,
    pub rate_last_ns: u64,
}

/// `struct fanout_counters`, one per CPU per group.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub forwarded: u64,
    pub copies: u64,
    pub bytes_out: u64,
    pub clone_errors: u64,
    pub bad_tag: u64,
    pub replays: u64,
    pub passed_up: u64,
    pub bytes_in: u64,
    pub queued: u64,
    pub lost: u64,
    pub rate_limited: u64,
    pub leave_fences: u64,
}

/// `PROTO_LEAVE`, `PROTO_LEAVE_LEN`: the datagrams the program fences a
/// group for (the LEAVE fence, see `leave_seen` in fanout.h). The C side's
/// constants are generated from the same `reflector-proto` values.
pub const PROTO_LEAVE: u8 = reflector_proto::protocol::Kind::Leave as u8;
pub const PROTO_LEAVE_LEN: usize = reflector_proto::protocol::size::LEAVE;

/// `FANOUT_RESEND_MAX` (fanout.bpf.c asserts it equals the generated
/// `PROTO_MAX_DATAGRAM_KERNEL`).
pub const RESEND_MAX: usize = reflector_proto::protocol::MAX_DATAGRAM_KERNEL;
/// Bytes of `struct fanout_resend` before the datagram.
pub const RESEND_HEAD: usize = 16;

const _: () = assert!(std::mem::size_of::<Dest>() == 28);
const _: () = assert!(std::mem::size_of::<GroupValue>() == 24 + 28 * MAX_MEMBERS);
const _: () = assert!(std::mem::size_of::<MemberKey>() == 8);
const _: () = assert!(std::mem::size_of::<MemberValue>() == 80);
const _: () = assert!(std::mem::size_of::<Counters>() == 96);

// SAFETY: plain `#[repr(C)]` integers and byte arrays with no padding the
// compiler adds (the sizes above equal the sums of the fields), so every bit
// pattern is a valid value and the kernel may read or write them as bytes.
unsafe impl aya::Pod for Dest {}
// SAFETY: as above.
unsafe impl aya::Pod for GroupValue {}
// SAFETY: as above.
unsafe impl aya::Pod for MemberKey {}
// SAFETY: as above.
unsafe impl aya::Pod for MemberValue {}
// SAFETY: as above.
unsafe impl aya::Pod for Counters {}

#[repr(C, align(8))]
struct Aligned<T: ?Sized>(T);

/// The compiled program (built by `build.rs` with clang), 8-byte aligned
/// as the ELF parser wants it.
pub fn object() -> &'static [u8] {
    static OBJ: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/fanout.bpf.o")));
    &OBJ.0
}
