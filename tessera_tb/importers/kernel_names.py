"""Compare kernel names spelled by different tools (Kineto/CUPTI vs Nsight Compute).

The same kernel is demangled differently by the two sources:

    Kineto: void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>,
            std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)
    ncu:    void at::vectorized_elementwise_kernel<4, at::FillFunctor<float>,
            std::array<char *, 1>>(int, T2, T3)

Namespaces differ (`at::native::(anonymous namespace)::` vs `at::<unnamed>::`, `native::`
dropped), lambdas are `{lambda(float)#1}` vs `[lambda(float) (instance 1)]`, parameter lists
name types vs template placeholders `T2`, literals are `1ul`/`false` vs `1`/`0`, and spacing
differs. `kernel_name_key` keeps what both agree on: the identifiers in order (function name,
template arguments, lambda instance numbers), without namespaces, parameter lists, literals,
and keywords. `kernel_base_name` is the function's own identifier (what
`ncu --print-kernel-base function` prints). Simple names (`nvjet_sm90_tst_...`) are their own key.
"""

from __future__ import annotations

import re
from functools import lru_cache

_LAMBDA_NCU = re.compile(r"\[lambda\([^()]*\) \(instance (\d+)\)\]")
_LAMBDA_GCC = re.compile(r"\{lambda\([^()]*\)#(\d+)\}")
_ANON_NAMESPACE = re.compile(r"\(anonymous namespace\)::|<unnamed>::")
_TOKEN = re.compile(r"lambda#\d+|[0-9][\w.]*|[A-Za-z_]\w*(?:::)?")
# Words that either tool may add or drop without changing which kernel it is.
_NOISE = frozenset({"void", "const", "volatile", "struct", "class", "unsigned", "signed", "true",
                    "false", "operator"})  # fmt: skip
_PLACEHOLDER = re.compile(r"^T\d+$")


def _drop_parenthesised(text: str) -> str:
    """Replace every (...) group, nested ones included, by a space: parameter lists and C-style
    casts go, and `f(args)::{lambda}` keeps `f` as a word instead of a `f::` qualifier."""
    out, depth = [], 0
    for ch in text:
        if ch == "(":
            if depth == 0:
                out.append(" ")
            depth += 1
        elif ch == ")":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _tokens(name: str) -> list[str]:
    text = _LAMBDA_NCU.sub(r" lambda#\1 ", name)
    text = _LAMBDA_GCC.sub(r" lambda#\1 ", text)
    text = _ANON_NAMESPACE.sub("", text)
    text = _drop_parenthesised(text)
    tokens = []
    for tok in _TOKEN.findall(text):
        if tok.endswith("::") or tok[0].isdigit():  # a namespace or class qualifier, a literal
            continue
        if tok in _NOISE or _PLACEHOLDER.match(tok):
            continue
        tokens.append(tok)
    return tokens


@lru_cache(maxsize=65536)
def kernel_name_key(name: str) -> str:
    """A spelling-independent key of a demangled kernel name (see the module docstring)."""
    tokens = _tokens(name)
    return " ".join(tokens) if tokens else name.strip()


@lru_cache(maxsize=65536)
def kernel_base_name(name: str) -> str:
    """The kernel function's own identifier: `vectorized_elementwise_kernel`, `nvjet_...`."""
    tokens = _tokens(name)
    return tokens[0] if tokens else name.strip()
