"""CPU: what `import cutequant` loads, and the lazily imported `cutequant.reference`."""

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_is_cheap_and_reference_is_lazy():
    out = _run(
        """
        import sys
        import cutequant
        print("cutlass" in sys.modules, "cutequant.reference" in sys.modules)
        ref = cutequant.reference
        print("cutequant.reference" in sys.modules, ref is sys.modules["cutequant.reference"])
        import torch
        codes = ref.e2m1_encode(torch.tensor([0.25, 0.75, 5.0, -6.5]))
        print(codes.tolist())
        """
    )
    # 0.25 -> 0 and 0.75 -> 1.0 (ties to even), 5 -> 4, -6.5 saturates to -6 (sign bit 8)
    assert out.splitlines() == ["False False", "True True", "[0, 2, 6, 15]"]


def test_unknown_attribute_is_an_attribute_error():
    out = _run(
        """
        import cutequant
        try:
            cutequant.no_such_thing
        except AttributeError as exc:
            print(exc)
        """
    )
    assert out == "module 'cutequant' has no attribute 'no_such_thing'"
