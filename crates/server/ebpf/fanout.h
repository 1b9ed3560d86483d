/* Map layouts shared by fanout.bpf.c and the Rust loader (src/kfanout/sys.rs
 * mirrors them with #[repr(C)] structs and checks the same sizes). Addresses
 * and ports are in network byte order, as they sit in the packet, so the
 * program compares and writes them without swapping. */
#ifndef REFLECTOR_FANOUT_H
#define REFLECTOR_FANOUT_H

#include <linux/types.h>

/* Most members one group can have in the kernel path: the destination array
 * is one map value, replaced whole on every membership change so a program
 * run never sees half of an update. A larger group is served by the
 * user-space path (the group's PASS_UP flag); raise this constant (and
 * MAX_MEMBERS in sys.rs) to lift the limit: the value grows 28 bytes per
 * member and the replication loop (bpf_loop) has no practical bound. It
 * must stay a power of two (the program masks indexes with it). */
#define FANOUT_MAX_MEMBERS 1024
/* Groups (ports) one reflector can serve in the kernel path. */
#define FANOUT_MAX_GROUPS 4096
/* Senders (members of all groups) the member map holds. */
#define FANOUT_MAX_SENDERS 65536

/* The largest datagram the kernel path fans out: what a failed copy's
 * ring-buffer record can carry for user space to resend (a 1500-byte MTU
 * less the IPv4 and UDP headers). Larger DATA (jumbo frames) goes up. */
#define FANOUT_RESEND_MAX 1472
/* The record's data room: a power of two above FANOUT_RESEND_MAX, so the
 * program can bound a copy's length with a mask the verifier follows. */
#define FANOUT_RESEND_BUF 2048
/* Bytes of the resend ring buffer (a power of two, a multiple of pages). */
#define FANOUT_RESEND_RING (1 << 22)

/* The protocol (docs/protocol.md): version 2 header, DATA, tag offsets. */
#define PROTO_MAGIC 0x5246
#define PROTO_VERSION 2
#define PROTO_DATA 6
/* LEAVE: the header and a 16-byte MAC, nothing else (the LEAVE fence). */
#define PROTO_LEAVE 4
#define PROTO_LEAVE_LEN 40
#define PROTO_HEADER_LEN 24
#define PROTO_TAG_OFF 24
#define PROTO_DATA_MIN 32

/* Group flags. */
#define GROUP_TAGS 1u    /* DATA must carry a valid SipHash-2-4 tag */
#define GROUP_PASS_UP 2u /* serve this group in user space for now */

/* One destination: where a copy goes, from which address, and with which
 * Ethernet header. */
struct fanout_dest {
	__u32 ip;      /* member address (network order) */
	__u16 port;    /* member port (network order) */
	__u16 _pad;
	__u32 ifindex; /* egress device */
	__u32 sip;     /* source address: what the group's socket would send from */
	__u8 dmac[6];  /* next hop (the member itself on a shared segment) */
	__u8 smac[6];  /* the egress device's address */
};

/* groups: key = group port (network order). */
struct fanout_group {
	__u32 id;    /* index into the per-group arrays */
	__u32 flags; /* GROUP_* */
	__u32 count; /* entries of dest[] in use */
	__u32 addr;  /* the address the group's socket is bound to, 0 for any */
	__u32 pps;   /* each member's DATA cap: packets per second, 0 for none */
	__u32 bps;   /* and bytes per second, 0 for none */
	struct fanout_dest dest[FANOUT_MAX_MEMBERS];
};

/* members: one per sender, keyed by its address and the group. */
struct fanout_member_key {
	__u32 ip;   /* network order */
	__u16 port; /* network order */
	__u16 group; /* group port, network order */
};

struct fanout_member {
	struct bpf_spin_lock lock; /* guards highest and bitmap */
	__u32 player;     /* header field, network order */
	__u32 membership; /* header field, network order */
	__u32 _pad;
	__u64 k0, k1;     /* SipHash key, little-endian words of the tag key */
	__u64 highest;    /* replay window: highest sequence accepted */
	__u64 bitmap;     /* bit i: highest - i seen */
	__u64 data_in;    /* DATA forwarded in the kernel: a sign of life */
	/* The rate cap's token buckets, in 1e-9 packet and 1e-9 byte units
	 * (so refills need no division), full (one second's worth) at start,
	 * and when they were last refilled (kernel monotonic ns: the cap is in
	 * real time, so under time dilation it is TDF times looser). */
	__u64 rate_pkts;
	__u64 rate_bytes;
	__u64 rate_last_ns;
};

/* counters: per-CPU array indexed by group id. */
struct fanout_counters {
	__u64 forwarded;  /* member DATA fanned out in the kernel */
	__u64 copies;     /* clones sent */
	__u64 bytes_out;  /* UDP payload bytes of those clones */
	__u64 clone_errors; /* clones the stack refused */
	__u64 bad_tag;    /* DATA whose tag did not verify: dropped */
	__u64 replays;    /* DATA whose sequence was seen: dropped */
	__u64 passed_up;  /* datagrams to a group port left to user space */
	__u64 bytes_in;   /* member DATA bytes (UDP payload) handled here */
	__u64 queued;     /* failed clones handed to user space to resend */
	__u64 lost;       /* failed clones the ring buffer had no room for */
	__u64 rate_limited; /* DATA beyond its member's rate cap: dropped */
	__u64 leave_fences; /* LEAVEs matching a member: leave_seen bumped */
};

/* queued and resent: arrays indexed by group id. The program adds the
 * copies it hands up to `queued`; the resend thread writes to `resent` how
 * many of them it has dealt with. While they differ the group is congested
 * and the program passes its DATA up: user space then waits on the full
 * queue behind the resends (paper 000's sender put to sleep), instead of the
 * kernel piling up copies it cannot send. held (same index): set by user
 * space while it serves the group's DATA itself, until its socket is
 * drained, so the kernel path does not overtake what is queued there.
 *
 * leave_seen and leave_done (same index): the LEAVE fence. The program
 * cannot check a LEAVE's MAC (HMAC-SHA256 under a key it does not hold),
 * so a LEAVE (PROTO_LEAVE, PROTO_LEAVE_LEN bytes) whose source address is a
 * member's key and whose header carries that member's player and
 * membership id adds 1 to leave_seen and goes up. While leave_seen differs
 * from leave_done the group's DATA goes up too: it queues behind the LEAVE
 * in the socket, and user space, which removes the member first if the
 * LEAVE is valid, serves it in order. User space adds 1 to leave_done for
 * each such LEAVE it has judged (valid or not), and when a LEAVE was lost
 * on the way up (a full socket buffer) it sets leave_done to a leave_seen
 * value read before a drain of the socket that found it empty, so a lost
 * LEAVE holds the group in user space only until then. */

/* resend: a copy the stack refused (full qdisc, full queue), for user
 * space to send through the group's socket, waiting as long as it must. */
struct fanout_resend {
	__u16 group; /* group port, network order */
	__u16 port;  /* member port, network order */
	__u32 ip;    /* member address, network order */
	__u32 len;   /* bytes of data[] used */
	__u32 _pad;
	__u8 data[FANOUT_RESEND_BUF];
};

#endif
