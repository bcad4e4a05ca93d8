"""Helpers for the cache tests: read the GPU arch out of an exported kernel object."""

import struct

EM_CUDA = 190
EF_CUDA_ACCELERATORS = 0x800  # the "a" of sm_90a (arch-specific features: wgmma, setmaxnreg)


def embedded_cubin_archs(obj: bytes) -> list[str]:
    """Arch of every CUDA ELF (cubin) embedded in a host object file, e.g. ["sm_90a"]: the
    object ``export_to_c`` writes is an x86 ELF that carries the kernel's cubin as data."""
    archs = []
    at = obj.find(b"\x7fELF", 1)
    while at > 0:
        header = obj[at : at + 64]
        if len(header) == 64 and struct.unpack_from("<H", header, 18)[0] == EM_CUDA:
            flags = struct.unpack_from("<I", header, 48)[0]
            suffix = "a" if flags & EF_CUDA_ACCELERATORS else ""
            archs.append(f"sm_{flags & 0xFF}{suffix}")
        at = obj.find(b"\x7fELF", at + 1)
    return archs
