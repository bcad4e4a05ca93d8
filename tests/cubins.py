"""Helpers for the cache tests: read the GPU arch out of an exported kernel object."""

import struct

EM_CUDA = 190
EF_CUDA_ACCELERATORS = 0x800  # the "a" of sm_90a (arch-specific features: wgmma, setmaxnreg)
# Blackwell cubins use the second CUDA ELF ABI (e_ident[EI_OSABI] = 0x41): the SM number in
# flag bits 8-15, the "a" in bit 3 (sm_100a: 0x0600640A, sm_120a: 0x0600780A from 4.8.1)
ELFOSABI_CUDA_V2 = 0x41
EF_CUDA_ACCELERATORS_V2 = 0x8


def embedded_cubin_archs(obj: bytes) -> list[str]:
    """Arch of every CUDA ELF (cubin) embedded in a host object file, e.g. ["sm_90a"]: the
    object ``export_to_c`` writes is an x86 ELF that carries the kernel's cubin as data."""
    archs = []
    at = obj.find(b"\x7fELF", 1)
    while at > 0:
        header = obj[at : at + 64]
        if len(header) == 64 and struct.unpack_from("<H", header, 18)[0] == EM_CUDA:
            flags = struct.unpack_from("<I", header, 48)[0]
            if header[7] == ELFOSABI_CUDA_V2:
                sm, accel = (flags >> 8) & 0xFF, flags & EF_CUDA_ACCELERATORS_V2
            else:
                sm, accel = flags & 0xFF, flags & EF_CUDA_ACCELERATORS
            archs.append(f"sm_{sm}{'a' if accel else ''}")
        at = obj.find(b"\x7fELF", at + 1)
    return archs
