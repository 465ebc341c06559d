//! The bind guard's eBPF program, run by the kernel at every `bind(2)` of a process below the
//! node's pod cgroup (`kubepods`), before the port is taken. It decides from maps the agent
//! keeps, so no decision waits for the agent:
//!
//! 1. A bind of port 0, of a port no guarded pool has, or in another network namespace than
//!    the node's (a pod-network pod): allowed, untouched.
//! 2. The pod is found from the process's cgroup: the ancestor one level below `kubepods`, or
//!    two levels below when that one is a QoS directory (`burstable`, `besteffort`).
//! 3. The pod that holds the port on this node binds it: allowed. Another pod's holder entry
//!    counts only until `config[CONFIG_OWNERS_UNTIL]`, which the agent moves on after every
//!    round that brought the maps up to date (its heartbeat): while no agent keeps them, an
//!    entry may name a pod deleted since, and a replacement must not be refused its port.
//! 4. A pod the agent has not seen yet (its cgroup is that new) binds a port no seen pod holds
//!    here (or whose holder entry has lapsed): allowed, and the port is claimed for that
//!    cgroup, so a second unseen pod is refused; the agent checks the claim against the record
//!    as soon as it sees the pod. So a pod binding at its first instant is never refused its
//!    own port.
//! 5. Anything else is a foreign bind: refused with EPERM under `Enforce`, allowed under
//!    `Audit`; either way counted in the verdict map, which the agent reports from.
//!
//! Maps (key → value):
//! - `config` (array, u32 → u64): [0] the node's network namespace cookie, [1] the cgroup level
//!   of `kubepods`' children, [2] until when (`CLOCK_MONOTONIC` ns, the clock of
//!   `bpf_ktime_get_ns`) holder entries count; 0, never written: they do not.
//! - `modes` (array, slot → u32): [`MODE_AUDIT`] or [`MODE_ENFORCE`] for each guarded port; a
//!   slot is `port + 65536 × protocol index` ([`slot`]).
//! - `pods` (hash, cgroup id → u32): [`POD_SEEN`] for every pod cgroup the agent has seen and
//!   knows the ports of, [`QOS_DIR`] for the QoS directories.
//! - `owners` (hash, slot → cgroup id): the pod that holds each port on this node.
//! - `claims` (hash, slot → cgroup id): ports taken by pods not seen yet.
//! - `verdicts` (hash, [`VerdictKey`] → u64 count): foreign and claimed binds, to report.

use super::bpf_insn::*;

/// A port's mode in `modes`.
pub const MODE_AUDIT: u32 = 1;
pub const MODE_ENFORCE: u32 = 2;
/// Values in `pods`.
pub const POD_SEEN: u32 = 1;
pub const QOS_DIR: u32 = 2;
/// Verdicts the program records.
pub const VERDICT_REFUSED: u32 = 1;
pub const VERDICT_AUDITED: u32 = 2;
pub const VERDICT_CLAIMED: u32 = 3;
/// Slots per protocol in `modes`, `owners` and `claims`.
pub const PORTS: u32 = crate::ledger::node_guard::PORTS_PER_PROTOCOL;
/// TCP, UDP, SCTP.
pub const PROTOCOLS: u32 = 3;
pub const CONFIG_NETNS_COOKIE: u32 = 0;
pub const CONFIG_POD_LEVEL: u32 = 1;
pub const CONFIG_OWNERS_UNTIL: u32 = 2;

const IPPROTO_TCP: i32 = 6;
const IPPROTO_UDP: i32 = 17;
const IPPROTO_SCTP: i32 = 132;
/// `struct bpf_sock_addr`: the port asked for (network order, low 16 bits) and the protocol.
const CTX_USER_PORT: i16 = 24;
const CTX_PROTOCOL: i16 = 36;
/// Kernel helpers.
const MAP_LOOKUP_ELEM: i32 = 1;
const MAP_UPDATE_ELEM: i32 = 2;
const KTIME_GET_NS: i32 = 5;
const GET_NETNS_COOKIE: i32 = 122;
const GET_CURRENT_ANCESTOR_CGROUP_ID: i32 = 123;
/// Map update flag: only if absent.
const NOEXIST: i32 = 1;

/// The slot of `port` of `protocol` (0 TCP, 1 UDP, 2 SCTP) in the port-indexed maps.
pub fn slot(protocol_index: u32, port: u16) -> u32 {
    protocol_index * PORTS + u32::from(port)
}

/// A key of `verdicts`: which pod cgroup bound which slot, and what the program decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VerdictKey {
    pub cgroup: u64,
    pub slot: u32,
    pub verdict: u32,
}

impl VerdictKey {
    pub const SIZE: usize = 16;

    pub fn to_bytes(self) -> [u8; 16] {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.cgroup.to_ne_bytes());
        bytes[8..12].copy_from_slice(&self.slot.to_ne_bytes());
        bytes[12..].copy_from_slice(&self.verdict.to_ne_bytes());
        bytes
    }

    pub fn from_bytes(bytes: &[u8]) -> Self {
        Self {
            cgroup: u64::from_ne_bytes(bytes[..8].try_into().expect("8 bytes")),
            slot: u32::from_ne_bytes(bytes[8..12].try_into().expect("4 bytes")),
            verdict: u32::from_ne_bytes(bytes[12..16].try_into().expect("4 bytes")),
        }
    }
}

/// The descriptors of the maps the program reads and writes.
#[derive(Clone, Copy, Debug)]
pub struct MapFds {
    pub config: i32,
    pub modes: i32,
    pub pods: i32,
    pub owners: i32,
    pub claims: i32,
    pub verdicts: i32,
}

// Stack slots below the frame pointer.
const KEY_CONFIG: i16 = -4;
const SLOT: i16 = -8;
const LEVEL: i16 = -16;
const POD: i16 = -24;
const VERDICT_CGROUP: i16 = -40;
const VERDICT_SLOT: i16 = -32;
const VERDICT_CODE: i16 = -28;
const VALUE: i16 = -48;

/// `r0 = lookup(map, r10 + key)`.
fn lookup(asm: &mut Assembler, map: i32, key: i16) {
    asm.extend(load_map_fd(R1, map))
        .push(mov(R2, R10))
        .push(add_imm(R2, key.into()))
        .push(call(MAP_LOOKUP_ELEM));
}

/// `r0 = update(map, r10 + key, r10 + value, flags)`.
fn update(asm: &mut Assembler, map: i32, key: i16, value: i16, flags: i32) {
    asm.extend(load_map_fd(R1, map))
        .push(mov(R2, R10))
        .push(add_imm(R2, key.into()))
        .push(mov(R3, R10))
        .push(add_imm(R3, value.into()))
        .push(mov_imm(R4, flags))
        .push(call(MAP_UPDATE_ELEM));
}

/// The program, for the bind4 and bind6 hooks alike. Registers kept across calls: r6 the
/// context, r7 the slot, r8 the pod's cgroup id, r9 the port's mode.
pub fn bind_program(maps: &MapFds) -> Vec<Insn> {
    let mut asm = Assembler::default();
    asm.push(mov(R6, R1));
    guarded_slot(&mut asm, maps);
    pod_cgroup(&mut asm, maps);
    holder_or_claim(&mut asm, maps);
    count_and_decide(&mut asm, maps);
    asm.finish()
}

/// Step 1: only guarded ports, only in the node's network namespace (r7 the slot, r9 its
/// mode). The port first: a bind of a port outside every pool (most binds) costs one lookup.
fn guarded_slot(asm: &mut Assembler, maps: &MapFds) {
    asm.push(load_u32(R7, R6, CTX_USER_PORT))
        .push(to_be16(R7))
        .jump(Jump::EqImm(R7, 0), "allow")
        .push(load_u32(R1, R6, CTX_PROTOCOL))
        .jump(Jump::EqImm(R1, IPPROTO_TCP), "slot")
        .jump(Jump::EqImm(R1, IPPROTO_UDP), "udp")
        .jump(Jump::NeImm(R1, IPPROTO_SCTP), "allow")
        .push(add_imm(R7, 2 * PORTS as i32))
        .jump(Jump::Always, "slot")
        .label("udp")
        .push(add_imm(R7, PORTS as i32))
        .label("slot")
        .push(store_u32(R10, SLOT, R7));
    lookup(asm, maps.modes, SLOT);
    asm.jump(Jump::EqImm(R0, 0), "allow")
        .push(load_u32(R9, R0, 0))
        .jump(Jump::EqImm(R9, 0), "allow")
        .push(mov(R1, R6))
        .push(call(GET_NETNS_COOKIE))
        .push(store_u64(R10, VALUE, R0))
        .push(store_imm_u32(R10, KEY_CONFIG, CONFIG_NETNS_COOKIE as i32));
    lookup(asm, maps.config, KEY_CONFIG);
    // Another network namespace than the node's: a pod-network pod, whose ports are its own.
    asm.jump(Jump::EqImm(R0, 0), "allow")
        .push(load_u64(R1, R0, 0))
        .push(load_u64(R2, R10, VALUE))
        .jump(Jump::Ne(R1, R2), "allow");
}

/// Step 2: the pod's cgroup, in r8: one level below `kubepods`, or two below a QoS directory.
fn pod_cgroup(asm: &mut Assembler, maps: &MapFds) {
    asm.push(store_imm_u32(R10, KEY_CONFIG, CONFIG_POD_LEVEL as i32));
    lookup(asm, maps.config, KEY_CONFIG);
    asm.jump(Jump::EqImm(R0, 0), "allow")
        .push(load_u64(R1, R0, 0))
        .push(store_u64(R10, LEVEL, R1))
        .push(call(GET_CURRENT_ANCESTOR_CGROUP_ID))
        // 0: the process sits in kubepods itself, in no pod.
        .jump(Jump::EqImm(R0, 0), "allow")
        .push(mov(R8, R0))
        .push(store_u64(R10, POD, R8));
    lookup(asm, maps.pods, POD);
    asm.jump(Jump::EqImm(R0, 0), "pod")
        .push(load_u32(R1, R0, 0))
        .jump(Jump::NeImm(R1, QOS_DIR as i32), "pod")
        .push(load_u64(R1, R10, LEVEL))
        .push(add_imm(R1, 1))
        .push(call(GET_CURRENT_ANCESTOR_CGROUP_ID))
        .jump(Jump::EqImm(R0, 0), "allow")
        .push(mov(R8, R0))
        .push(store_u64(R10, POD, R8));
}

/// Steps 3 to 5: the holder on this node is allowed, a pod not seen yet may claim a port no
/// seen pod holds, and anything else is foreign (its verdict code, refused or audited, on the
/// stack).
fn holder_or_claim(asm: &mut Assembler, maps: &MapFds) {
    asm.label("pod");
    lookup(asm, maps.owners, SLOT);
    asm.jump(Jump::EqImm(R0, 0), "no_owner")
        .push(load_u64(R1, R0, 0))
        .jump(Jump::Eq(R1, R8), "allow")
        // Another pod's entry: past the agent's heartbeat, as if there were none. Only here,
        // so the holder's own bind costs no more.
        .push(call(KTIME_GET_NS))
        .push(store_u64(R10, VALUE, R0))
        .push(store_imm_u32(R10, KEY_CONFIG, CONFIG_OWNERS_UNTIL as i32));
    lookup(asm, maps.config, KEY_CONFIG);
    asm.jump(Jump::EqImm(R0, 0), "foreign")
        .push(load_u64(R1, R0, 0))
        .push(load_u64(R2, R10, VALUE))
        .jump(Jump::Gt(R2, R1), "no_owner")
        .jump(Jump::Always, "foreign");

    asm.label("no_owner");
    lookup(asm, maps.pods, POD);
    asm.jump(Jump::NeImm(R0, 0), "foreign");
    lookup(asm, maps.claims, SLOT);
    asm.jump(Jump::EqImm(R0, 0), "claim")
        .push(load_u64(R1, R0, 0))
        .jump(Jump::Eq(R1, R8), "allow")
        .jump(Jump::Always, "foreign")
        .label("claim")
        .push(store_u64(R10, VALUE, R8));
    update(asm, maps.claims, SLOT, VALUE, NOEXIST);
    // Another unseen pod claimed it in between: that one has it.
    asm.jump(Jump::NeImm(R0, 0), "foreign")
        .push(store_imm_u32(R10, VERDICT_CODE, VERDICT_CLAIMED as i32))
        .jump(Jump::Always, "record");

    asm.label("foreign")
        .push(mov_imm(R1, VERDICT_REFUSED as i32))
        .jump(Jump::NeImm(R9, MODE_AUDIT as i32), "code")
        .push(mov_imm(R1, VERDICT_AUDITED as i32))
        .label("code")
        .push(store_u32(R10, VERDICT_CODE, R1));
}

/// Count the verdict for the agent to report, then allow, or refuse a refused one.
fn count_and_decide(asm: &mut Assembler, maps: &MapFds) {
    asm.label("record")
        .push(store_u64(R10, VERDICT_CGROUP, R8))
        .push(load_u32(R1, R10, SLOT))
        .push(store_u32(R10, VERDICT_SLOT, R1));
    lookup(asm, maps.verdicts, VERDICT_CGROUP);
    asm.jump(Jump::EqImm(R0, 0), "first")
        .push(mov_imm(R1, 1))
        .push(atomic_add_u64(R0, 0, R1))
        .jump(Jump::Always, "decide")
        .label("first")
        .push(store_imm_u64(R10, VALUE, 1));
    update(asm, maps.verdicts, VERDICT_CGROUP, VALUE, 0);
    asm.label("decide")
        .push(load_u32(R1, R10, VERDICT_CODE))
        .jump(Jump::EqImm(R1, VERDICT_REFUSED as i32), "deny")
        .label("allow")
        .push(mov_imm(R0, 1))
        .push(exit())
        .label("deny")
        .push(mov_imm(R0, 0))
        .push(exit());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_keep_protocols_apart() {
        assert_eq!(slot(0, 8080), 8080);
        assert_eq!(slot(1, 8080), 65536 + 8080);
        assert_eq!(slot(2, 65535), 3 * 65536 - 1);
    }

    #[test]
    fn verdict_keys_round_trip() {
        let key = VerdictKey {
            cgroup: 0x0102_0304_0506_0708,
            slot: slot(1, 30001),
            verdict: VERDICT_AUDITED,
        };
        assert_eq!(VerdictKey::from_bytes(&key.to_bytes()), key);
    }

    #[test]
    fn the_program_ends_in_exits_and_refers_to_every_map() {
        let maps = MapFds {
            config: 11,
            modes: 12,
            pods: 13,
            owners: 14,
            claims: 15,
            verdicts: 16,
        };
        let program = bind_program(&maps);
        assert_eq!(program.last(), Some(&exit()));
        let fds: std::collections::BTreeSet<i32> = program
            .iter()
            .filter(|i| i.code == 0x18)
            .map(|i| i.imm)
            .collect();
        assert_eq!(fds, (11..=16).collect());
        // The clock is read only past the holder's own match (`if r1 == r8 goto allow`), so
        // the holder's bind costs no more for the heartbeat.
        let clock: Vec<usize> = (0..program.len())
            .filter(|&at| program[at] == call(KTIME_GET_NS))
            .collect();
        assert_eq!(clock.len(), 1);
        let before = program[clock[0] - 1];
        assert_eq!((before.code, before.regs), (0x1d, 0x81), "{before:?}");
        // Every jump lands inside the program.
        for (at, insn) in program.iter().enumerate() {
            if insn.code & 0x07 == 0x05 && insn.code != 0x85 && insn.code != 0x95 {
                let target = at as isize + 1 + insn.off as isize;
                assert!(
                    (0..program.len() as isize).contains(&target),
                    "jump at {at}"
                );
            }
        }
    }
}
