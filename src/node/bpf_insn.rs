//! eBPF instructions as the kernel reads them (`struct bpf_insn`), and the few encodings the bind
//! guard's program uses. Written by hand so the agent needs no compiler or object loader on the
//! node: the program is a few dozen instructions, assembled at run time with the map descriptors
//! it refers to.

/// One 8-byte eBPF instruction.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    /// Destination register in the low nibble, source register in the high one.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

/// A register: r0 return value, r1-r5 arguments, r6-r9 kept across calls, r10 the frame pointer.
pub type Reg = u8;
pub const R0: Reg = 0;
pub const R1: Reg = 1;
pub const R2: Reg = 2;
pub const R3: Reg = 3;
pub const R4: Reg = 4;
pub const R6: Reg = 6;
pub const R7: Reg = 7;
pub const R8: Reg = 8;
pub const R9: Reg = 9;
pub const R10: Reg = 10;

// Instruction classes, sizes, modes and operations (linux/bpf_common.h, linux/bpf.h).
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const ST: u8 = 0x02;
const STX: u8 = 0x03;
const ALU: u8 = 0x04;
const JMP: u8 = 0x05;
const ALU64: u8 = 0x07;
const W: u8 = 0x00;
const DW: u8 = 0x18;
const IMM: u8 = 0x00;
const MEM: u8 = 0x60;
const ATOMIC: u8 = 0xc0;
const K: u8 = 0x00;
const X: u8 = 0x08;
const ADD: u8 = 0x00;
const MOV: u8 = 0xb0;
const END: u8 = 0xd0;
const TO_BE: u8 = 0x08;
const JA: u8 = 0x00;
const JEQ: u8 = 0x10;
const JNE: u8 = 0x50;
const JGT: u8 = 0x20;
const CALL: u8 = 0x80;
const EXIT: u8 = 0x90;
/// `src_reg` of a 64-bit immediate load whose value is a map's file descriptor.
const PSEUDO_MAP_FD: u8 = 1;

fn insn(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

/// `dst = src` (64 bits).
pub fn mov(dst: Reg, src: Reg) -> Insn {
    insn(ALU64 | MOV | X, dst, src, 0, 0)
}

/// `dst = imm` (sign-extended to 64 bits).
pub fn mov_imm(dst: Reg, imm: i32) -> Insn {
    insn(ALU64 | MOV | K, dst, 0, 0, imm)
}

/// `dst += imm` (64 bits).
pub fn add_imm(dst: Reg, imm: i32) -> Insn {
    insn(ALU64 | ADD | K, dst, 0, 0, imm)
}

/// `dst = htobe16(dst)`: on a little-endian host, swap the low two bytes and clear the rest.
pub fn to_be16(dst: Reg) -> Insn {
    insn(ALU | END | TO_BE, dst, 0, 0, 16)
}

/// `dst = *(u32 *)(src + off)`.
pub fn load_u32(dst: Reg, src: Reg, off: i16) -> Insn {
    insn(LDX | W | MEM, dst, src, off, 0)
}

/// `dst = *(u64 *)(src + off)`.
pub fn load_u64(dst: Reg, src: Reg, off: i16) -> Insn {
    insn(LDX | DW | MEM, dst, src, off, 0)
}

/// `*(u32 *)(dst + off) = src`.
pub fn store_u32(dst: Reg, off: i16, src: Reg) -> Insn {
    insn(STX | W | MEM, dst, src, off, 0)
}

/// `*(u64 *)(dst + off) = src`.
pub fn store_u64(dst: Reg, off: i16, src: Reg) -> Insn {
    insn(STX | DW | MEM, dst, src, off, 0)
}

/// `*(u32 *)(dst + off) = imm`.
pub fn store_imm_u32(dst: Reg, off: i16, imm: i32) -> Insn {
    insn(ST | W | MEM, dst, 0, off, imm)
}

/// `*(u64 *)(dst + off) = imm` (sign-extended).
pub fn store_imm_u64(dst: Reg, off: i16, imm: i32) -> Insn {
    insn(ST | DW | MEM, dst, 0, off, imm)
}

/// `lock *(u64 *)(dst + off) += src`.
pub fn atomic_add_u64(dst: Reg, off: i16, src: Reg) -> Insn {
    insn(STX | DW | ATOMIC, dst, src, off, i32::from(ADD))
}

/// `dst = map` for the map whose descriptor is `fd`: two instruction slots.
pub fn load_map_fd(dst: Reg, fd: i32) -> [Insn; 2] {
    [
        insn(LD | DW | IMM, dst, PSEUDO_MAP_FD, 0, fd),
        insn(0, 0, 0, 0, 0),
    ]
}

/// Call the kernel helper numbered `helper`.
pub fn call(helper: i32) -> Insn {
    insn(JMP | CALL, 0, 0, 0, helper)
}

/// `return r0`.
pub fn exit() -> Insn {
    insn(JMP | EXIT, 0, 0, 0, 0)
}

/// A jump to a label, resolved once every label is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Jump {
    Always,
    /// `if dst == imm`.
    EqImm(Reg, i32),
    /// `if dst != imm`.
    NeImm(Reg, i32),
    /// `if dst == src`.
    Eq(Reg, Reg),
    /// `if dst != src`.
    Ne(Reg, Reg),
    /// `if dst > src`, unsigned.
    Gt(Reg, Reg),
}

impl Jump {
    fn encode(self, off: i16) -> Insn {
        match self {
            Self::Always => insn(JMP | JA, 0, 0, off, 0),
            Self::EqImm(dst, imm) => insn(JMP | JEQ | K, dst, 0, off, imm),
            Self::NeImm(dst, imm) => insn(JMP | JNE | K, dst, 0, off, imm),
            Self::Eq(dst, src) => insn(JMP | JEQ | X, dst, src, off, 0),
            Self::Ne(dst, src) => insn(JMP | JNE | X, dst, src, off, 0),
            Self::Gt(dst, src) => insn(JMP | JGT | X, dst, src, off, 0),
        }
    }
}

/// A program under assembly: instructions, named labels and the jumps waiting for them.
#[derive(Default)]
pub struct Assembler {
    insns: Vec<Insn>,
    labels: Vec<(&'static str, usize)>,
    jumps: Vec<(usize, Jump, &'static str)>,
}

impl Assembler {
    pub fn push(&mut self, insn: Insn) -> &mut Self {
        self.insns.push(insn);
        self
    }

    pub fn extend(&mut self, insns: impl IntoIterator<Item = Insn>) -> &mut Self {
        self.insns.extend(insns);
        self
    }

    /// The next instruction is `name`.
    pub fn label(&mut self, name: &'static str) -> &mut Self {
        assert!(
            self.labels.iter().all(|(l, _)| *l != name),
            "label {name} placed twice"
        );
        self.labels.push((name, self.insns.len()));
        self
    }

    pub fn jump(&mut self, jump: Jump, to: &'static str) -> &mut Self {
        self.jumps.push((self.insns.len(), jump, to));
        self.insns.push(insn(0, 0, 0, 0, 0));
        self
    }

    /// The finished program. Panics on a jump to a label never placed: a bug in the program's
    /// text, never in its input.
    pub fn finish(mut self) -> Vec<Insn> {
        for (at, jump, to) in std::mem::take(&mut self.jumps) {
            let target = self
                .labels
                .iter()
                .find(|(l, _)| *l == to)
                .unwrap_or_else(|| panic!("jump to label {to}, never placed"))
                .1;
            let off = i16::try_from(target as isize - at as isize - 1).expect("jump too far");
            self.insns[at] = jump.encode(off);
        }
        self.insns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_match_the_kernel_s() {
        // Values as clang's BPF backend emits them.
        assert_eq!(
            mov(R6, R1),
            Insn {
                code: 0xbf,
                regs: 0x16,
                off: 0,
                imm: 0
            }
        );
        assert_eq!(load_u32(R7, R6, 24).code, 0x61);
        assert_eq!(load_u64(R1, R0, 0).code, 0x79);
        assert_eq!(store_u64(R10, -8, R1).code, 0x7b);
        assert_eq!(store_imm_u32(R10, -4, 0).code, 0x62);
        assert_eq!(
            to_be16(R7),
            Insn {
                code: 0xdc,
                regs: 0x07,
                off: 0,
                imm: 16
            }
        );
        assert_eq!(atomic_add_u64(R0, 0, R1).code, 0xdb);
        assert_eq!(
            call(1),
            Insn {
                code: 0x85,
                regs: 0,
                off: 0,
                imm: 1
            }
        );
        assert_eq!(exit().code, 0x95);
        // `if r2 > r1 goto +3`, unsigned.
        let jgt = Jump::Gt(R2, R1).encode(3);
        assert_eq!((jgt.code, jgt.regs, jgt.off), (0x2d, 0x12, 3));
        let [first, second] = load_map_fd(R1, 7);
        assert_eq!((first.code, first.regs, first.imm), (0x18, 0x11, 7));
        assert_eq!(
            second,
            Insn {
                code: 0,
                regs: 0,
                off: 0,
                imm: 0
            }
        );
    }

    #[test]
    fn jumps_land_on_their_labels() {
        let mut asm = Assembler::default();
        asm.jump(Jump::EqImm(R0, 0), "out") // 0
            .push(mov_imm(R0, 1)) // 1
            .jump(Jump::Always, "end") // 2
            .label("out")
            .push(mov_imm(R0, 0)) // 3
            .label("end")
            .push(exit()); // 4
        let program = asm.finish();
        assert_eq!(program[0].off, 2);
        assert_eq!(program[0].code, 0x15);
        assert_eq!(program[2].off, 1);
        assert_eq!(program[2].code, 0x05);
    }

    #[test]
    #[should_panic(expected = "never placed")]
    fn a_jump_to_nowhere_is_a_bug() {
        let mut asm = Assembler::default();
        asm.jump(Jump::Always, "nowhere");
        asm.finish();
    }
}
