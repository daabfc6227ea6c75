"""The shape of the call path, held by tests: every op's arguments cross from Python into the compiled layer and
from one compiled function to another by keyword past the documented tensors (no call with more than 6 positional
arguments, the shared reader's own calls aside), each op's argument list is written once per layer (the public
function, its prepared form, its compiled fill) and each argument has one name in every layer and in the header's
params struct."""
import ast
import inspect
import re
from pathlib import Path

import pytest

import c_structs
import pydsa
from pydsa import _read

ROOT = Path(__file__).resolve().parents[1]
MOST_POSITIONAL = 6


def _calls_with_many_positionals(path: Path, root: Path = ROOT):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            plain = [a for a in node.args if not isinstance(a, ast.Starred)]
            if len(plain) > MOST_POSITIONAL:
                yield f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node.func)} ({len(plain)} positional)"


def test_no_call_in_the_package_passes_more_than_six_positional_arguments():
    files = [p for p in sorted((ROOT / "pydsa").rglob("*.py")) + sorted((ROOT / "pyplan").rglob("*.py"))
             if "bench" not in p.parts]
    assert len(files) > 10
    found = [hit for path in files for hit in _calls_with_many_positionals(path)]
    assert not found, found


def test_the_check_itself_finds_a_long_positional_call(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("f(1, 2, 3, 4, 5, 6, 7)\ng(1, 2, 3, 4, 5, 6, *rest, k=8)\n")
    assert [h.split(" ")[1] for h in _calls_with_many_positionals(src, tmp_path)] == ["f"]


def _names(fn) -> list:
    return [p.name for p in inspect.signature(fn).parameters.values() if p.name != "self"]


# (public one-shot, its prepared class or None, its compiled fill (a cdef function of the same .pyx) or None, header
# struct, the fill's plumbing: the params it fills, a commit's layer table, a prepared call's list of what it keeps)
OPS = [
    (pydsa.c128_decode, pydsa.C128Decode, "_decode", c_structs.C128DecodeParams, {"p", "keep"}),
    (pydsa.c128_prefill, pydsa.C128Prefill, "_prefill", c_structs.C128PrefillParams, {"p", "keep"}),
    (pydsa.c128_verify, pydsa.C128Verify, "_verify", c_structs.C128VerifyParams, {"p", "keep"}),
    (pydsa.c128_commit, pydsa.C128Commit, "_commit", c_structs.C128CommitParams, {"p", "layers", "capacity", "keep"}),
    (pydsa.kv_store, None, None, c_structs.KvStoreParams, set()),
    (pydsa.c4_decode, pydsa.C4Decode, "_decode", c_structs.C4Params, {"p", "keep"}),
    (pydsa.c4_extend, None, "_extend", c_structs.C4Params, {"p"}),
    (pydsa.c4_verify, None, "_verify", c_structs.C4Params, {"p"}),
    (pydsa.c128_offline_decode, None, None, c_structs.C128OfflineParams, set()),
    (pydsa.c128_offline_extend, None, None, c_structs.C128OfflineParams, set()),
    (pydsa.c4_plan_decode, None, None, c_structs.C4PlanParams, set()),
    (pydsa.c4_plan_extend, None, None, c_structs.C4PlanParams, set()),
    (pydsa.c128_decode_records, None, None, c_structs.RequestRecordsParams, set()),
    (pydsa.c128_prefill_records, None, None, c_structs.RequestRecordsParams, set()),
]
# public calls of the compiled layer that launch no op: sizes of a caller's buffers
NOT_OPS = {pydsa.kv_page_bytes, pydsa.indexer_page_bytes, pydsa.buffer_key}
# public arguments that the params struct holds in another form (a plan as its record pointers, compact as the
# output layout, extend and the flag arguments as flags); a c4 call's per-compressor arguments are the fields of
# its compressors' sides (dsa_c4_compressor), its records the decode_records
HELD_ELSEWHERE = {"plan", "compact", "extend", "stream", "pdl", "cooperative", "round_between_drafts", "reject_all",
                  "records_ahead"}
C4_SIDES = {"main", "indexer", "kv_score", "drafts", "indexer_kv_score", "indexer_drafts", "out", "indexer_out",
            "records"}


def test_every_public_call_of_the_compiled_layer_is_held_by_the_rules_below():
    """Each public one-shot call a filler defines, and each prepared class over the reader's Prepared, has its row in
    OPS: a new op's calls are held to one name per argument, one argument list per layer and the compiled call
    from their first commit, without a count or a list here to remember."""
    public = [getattr(pydsa, name) for name in pydsa.__all__]
    compiled = {obj for obj in public if callable(obj) and not isinstance(obj, type)
                and getattr(obj, "__module__", "").startswith("pydsa._fill_")}
    assert compiled - NOT_OPS - {op[0] for op in OPS} == set()
    prepared = {obj for obj in public if isinstance(obj, type) and issubclass(obj, _read.Prepared)}
    assert prepared and prepared == {op[1] for op in OPS if op[1] is not None}


@pytest.mark.parametrize("op", OPS, ids=lambda op: op[0].__name__)
def test_each_argument_has_one_name_in_every_layer(op):
    public, prepared, fill, struct, plumbing = op
    outer = _names(public)
    signatures = {(name, cls): params for name, cls, params in _pyx_signatures(_filler(public))}
    if prepared is not None:
        assert _names(prepared) == [n for n in outer if n != "stream"]
        assert signatures["__init__", prepared.__name__] == _names(prepared)
    if fill is not None:
        assert [n for n in signatures[fill, None] if n not in plumbing] == [n for n in outer if n != "stream"]
    held = HELD_ELSEWHERE | (C4_SIDES if struct is c_structs.C4Params else set())
    held |= {"records"} if struct is c_structs.C128OfflineParams else set()  # the decode_records
    fields = {f[0] for f in struct._fields_}
    missing = [n for n in outer if n not in fields | held]
    assert not missing, f"{public.__name__}: {missing} are not fields of {struct.__name__}"


@pytest.mark.parametrize("op", OPS, ids=lambda op: op[0].__name__)
def test_a_public_one_shot_call_is_its_compiled_fill(op):
    """No Python frame between the caller and the fill: the one-shot function is the compiled one (its host
    time per call is the fill's), and its error is the library's error."""
    public = op[0]
    assert public.__module__.startswith("pydsa._fill_"), public.__module__
    assert public.__doc__ and len(public.__doc__) > 200


# ---- the compiled layer (.pyx): read as text, strings and comments aside

_STRING = re.compile(r'(?:[rbfuRBFU]{0,2})("""(?:.|\n)*?"""|\'\'\'(?:.|\n)*?\'\'\'|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\')')


def _code(text: str) -> str:
    """Cython source with its strings emptied and its comments dropped (line numbers kept)."""
    text = _STRING.sub(lambda m: '""' + "\n" * m[0].count("\n"), text)
    return re.sub(r"#[^\n]*", "", text)


def _split(args: str) -> list:
    """Top-level comma-separated parts of a parenthesised argument text."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(args):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(args[start:i])
            start = i + 1
    parts.append(args[start:])
    return [p.strip() for p in parts if p.strip()]


def _closing(code: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(code)):
        depth += code[i] in "([{"
        depth -= code[i] in ")]}"
        if depth == 0:
            return i
    raise ValueError("unbalanced")


def _pyx_signatures(path: Path) -> list:
    """(function name, enclosing class or None, parameter names) of every def / cdef / cpdef function."""
    code, found, cls = _code(path.read_text()), [], None
    for m in re.finditer(r"^([ \t]*)(?:(cdef\s+class|class)\s+(\w+)|(?:cp?def|def)\b[^=\n(]*?(\w+)\()", code, re.M):
        if m[2]:
            cls = m[3]
            continue
        if not m[1]:
            cls = None
        end = _closing(code, m.end() - 1)
        names = []
        for part in _split(code[m.end():end]):
            part = part.split("=")[0].split(":")[0].strip()
            if part in ("*", "/") or part.startswith("**"):
                continue
            names.append(re.findall(r"\w+", part)[-1])
        found.append((m[4], cls if m[1] else None, [n for n in names if n != "self"]))
    return found


def _pyx_calls(path: Path) -> list:
    """(line, callee, positional argument texts, keyword names and values) of every call in a .pyx file; a
    function's signature is no call."""
    code, found = _code(path.read_text()), []
    for m in re.finditer(r"(?<![\w.])([A-Za-z_][\w.]*)\(", code):
        line_start = code.rfind("\n", 0, m.start()) + 1
        if re.match(r"[ \t]*(?:cp?def|def|class|cdef\s+class)\b[^=]*$", code[line_start:m.start()]):
            continue
        end = _closing(code, m.end() - 1)
        parts = _split(code[m.end():end])
        keywords = {k.strip(): v.strip() for k, v in (p.split("=", 1) for p in parts
                                                      if re.match(r"\w+\s*=(?!=)", p))}
        positional = [p for p in parts if not re.match(r"\w+\s*=(?!=)", p) and not p.startswith("*")]
        found.append((code.count("\n", 0, m.start()) + 1, m[1], positional, keywords))
    return found


def _readers() -> set:
    """The shared readers' functions (declared in pydsa/_read.pxd and pydsa/_fill_store.pxd): they read one
    argument at a time (its object, where it goes, its name, what it must be) and may take more positionals."""
    found = set()
    for name in ("_read.pxd", "_fill_store.pxd"):
        found |= set(re.findall(r"^\s*c?p?def\s+[^\n(=]*?(\w+)\(", (ROOT / "pydsa" / name).read_text(), re.M))
    return found


def _long_pyx_calls(path: Path, readers: set, root: Path = ROOT):
    for line, callee, positional, _ in _pyx_calls(path):
        if len(positional) > MOST_POSITIONAL and callee not in readers:
            yield f"{path.relative_to(root)}:{line} {callee} ({len(positional)} positional)"


def test_no_op_level_call_in_the_compiled_layer_passes_more_than_six_positional_arguments():
    """Outside the shared reader (pydsa/_read.pyx and what it includes) a compiled call passes an op's arguments
    by keyword past the sixth: a fill, a side of a c4 call, a params head."""
    files = [p for p in sorted((ROOT / "pydsa").glob("*.pyx")) + sorted((ROOT / "pydsa").glob("*.pxi"))
             if not p.name.startswith("_read")]
    assert len(files) >= 8
    readers = _readers()
    assert {"tensor", "vector", "store_arg", "state_arg"} <= readers and "_side" not in readers
    found = [hit for path in files for hit in _long_pyx_calls(path, readers)]
    assert not found, found


def test_the_compiled_check_itself_finds_a_long_positional_call(tmp_path):
    src = tmp_path / "x.pyx"
    src.write_text('cdef int f(dsa_p* p, int a, b, c, d, e, g, h) except -1:\n    return 0\n'
                   'def g(x):\n    """f(1, 2, 3, 4, 5, 6, 7)"""  # f(1, 2, 3, 4, 5, 6, 7)\n'
                   '    f(&p, <int>x, (1, 2), "a,b", x[1:2], 5, 6, 7)\n    f(&p, a=1, b=2, c=3, d=4, e=5, g=6, h=7)\n'
                   '    tensor(x, &a, "x", F32, dev, 2, ANY, ANY, keep)\n')
    assert [h.split(" ", 1)[1] for h in _long_pyx_calls(src, {"tensor"}, tmp_path)] == ["f (8 positional)"]
    assert _pyx_signatures(src) == [("f", None, ["p", "a", "b", "c", "d", "e", "g", "h"]), ("g", None, ["x"])]


def _filler(public) -> Path:
    return ROOT / "pydsa" / (public.__module__.split(".")[-1] + ".pyx")


@pytest.mark.parametrize("op", OPS, ids=lambda op: op[0].__name__)
def test_each_op_argument_list_is_written_once_per_layer(op):
    """In its filler an op's arguments are written as a signature once per layer: the public one-shot function,
    the prepared form's __init__ (a compiled class of the filler) and the one fill both fill through; the two
    call the fill naming every argument (`name=name`)."""
    public, prepared, fill, _, plumbing = op
    outer = [n for n in _names(public) if n != "stream"]
    path = _filler(public)
    written = sorted((name, cls) for name, cls, params in _pyx_signatures(path) if set(outer) <= set(params))
    expected = [(public.__name__, None)] + ([("__init__", prepared.__name__)] if prepared else [])
    assert written == sorted(expected + ([(fill, None)] if fill else [])), written
    if fill is None:
        return
    calls = [(line, positional, keywords) for line, callee, positional, keywords in _pyx_calls(path) if callee == fill]
    assert len(calls) == len(expected), calls
    for line, positional, keywords in calls:
        assert len(positional) <= 1 and set(keywords) >= set(outer), (path.name, line)  # the params, then names
        assert all(keywords[n] == n for n in outer), (path.name, line, keywords)


def test_the_prepared_forms_are_compiled_classes_over_the_readers_prepared():
    """A prepared form is its filler's class over pydsa/_read.pyx's Prepared (the params bytes, the op's row, the
    device, what the params point into, launch()); no Python module writes one or binds one."""
    from pydsa import _op
    prepared = [op[1] for op in OPS if op[1] is not None]
    assert prepared
    for cls in prepared:
        assert issubclass(cls, _read.Prepared) and cls.__module__.startswith("pydsa._fill_"), cls
    assert not hasattr(_op, "Prepared")
    for path in sorted((ROOT / "pydsa").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                assert "Prepared" not in [ast.unparse(b).split(".")[-1] for b in node.bases], (path.name, node.name)
            assert not (isinstance(node, ast.Attribute) and node.attr == "_bind"), (path.name, node.lineno)


def test_the_c128_params_begin_with_one_head():
    """pydsa/_fill_c128.pxd's c128_head (filled by one inline function) is the first fields of every online c128
    op's params, as the header lays them out."""
    head = re.search(r"cdef struct c128_head:\n((?:    .*\n)+)", (ROOT / "pydsa" / "_fill_c128.pxd").read_text())[1]
    names = [line.split()[-1] for line in head.splitlines()]
    assert names == ["struct_size", "flags", "device", "head_dim", "num_slots", "batch_size"]
    first = None
    for struct in (c_structs.C128DecodeParams, c_structs.C128PrefillParams, c_structs.C128VerifyParams,
                   c_structs.C128CommitParams):
        fields = [(f[0], f[1], getattr(struct, f[0]).offset) for f in struct._fields_[:len(names)]]
        assert [f[0] for f in fields] == names, struct
        first = first or fields
        assert fields == first, struct


def _imports(path: Path) -> set:
    """The pydsa modules a module imports (Python: every import statement, docstrings aside; Cython: its
    import and cimport lines)."""
    found = set()
    if path.suffix == ".py":
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level == 1 or mod == "pydsa" or mod.startswith("pydsa."):
                    base = mod[len("pydsa."):] if mod.startswith("pydsa.") else ("" if mod == "pydsa" else mod)
                    if base:
                        found.add(base.split(".")[0])
                    else:
                        found.update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("pydsa."))
    else:
        for m in re.finditer(r"^\s*(?:from\s+pydsa\.(\w+)\s+c?import|c?import\s+pydsa\.(\w+))", path.read_text(), re.M):
            found.add(m.group(1) or m.group(2))
    return found


def _cycles(graph: dict) -> list:
    cycles, done = [], set()

    def visit(node, stack):
        for nxt in sorted(graph.get(node, ())):
            if nxt in stack:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in done and nxt in graph:
                visit(nxt, stack + [nxt])
        done.add(node)
    for node in sorted(graph):
        if node not in done:
            visit(node, [node])
    return cycles


def test_the_import_graph_of_the_package_has_no_cycle():
    files = [p for p in (ROOT / "pydsa").iterdir() if p.suffix in (".py", ".pyx", ".pxd")]
    files += [p for p in (ROOT / "pydsa").glob("*/*.py")]
    graph = {}
    for path in files:
        name = path.stem if path.parent.name == "pydsa" else path.parent.name
        graph.setdefault(name, set()).update(n for n in _imports(path) if n != name)
    assert {"_read", "_tensors", "_op", "c128", "c4"} <= set(graph)
    assert "_read" not in graph["_tensors"], "the messages must not import the reader back"
    assert not _cycles(graph), _cycles(graph)


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_a_refused_argument_carries_its_name_and_the_sglang_layer_renames_it_from_that():
    import torch
    from pydsa import sglang
    state, ape = torch.randn(4, 1, 1536), torch.randn(128, 512)
    idx, seq = torch.zeros(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    with pytest.raises(pydsa.ArgumentValueError) as caught:
        pydsa.c128_decode(state, torch.randn(2, 1000), torch.empty(2, 512), ape, idx, seq)
    err = caught.value
    assert isinstance(err, ValueError) and err.argument == "kv_score" and str(err).startswith("kv_score must have")
    renamed = err.renamed("kv_score_input")
    assert type(renamed) is type(err) and renamed.argument == "kv_score_input"
    assert str(renamed) == "kv_score_input" + str(err)[len("kv_score"):]
    with pytest.raises(pydsa.ArgumentTypeError) as caught:
        pydsa.c128_decode(state, torch.randn(2, 1024).double(), torch.empty(2, 512), ape, idx, seq)
    assert isinstance(caught.value, TypeError) and caught.value.argument == "kv_score"
    plan = sglang.CompressorDecodePlan(128, torch.zeros(2, 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"^kv_score_input must have shape"):
        sglang.compress_forward(torch.randn(4, 1536), torch.randn(2, 1000), ape, plan,
                                out=torch.empty(2, 512), head_dim=512, compress_ratio=128, is_online=True)


def test_the_sglang_layer_reads_no_error_message():
    for path in (ROOT / "pydsa" / "sglang").glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in n.names} | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "re" not in imported, f"{path.name} imports re"


def _private_pydsa_imports(path: Path, package: str = "pydsa.sglang") -> list:
    """The private pydsa modules (a name past "pydsa." starting with "_") a module of `package` imports, by
    import statement (absolute or relative; `from X import y` where y is a module counts as importing X.y). The
    package's own modules are its business: only pydsa's below it are held to their public names."""
    def private(mod: str) -> bool:
        if not (mod == "pydsa" or mod.startswith("pydsa.")) or mod == package or mod.startswith(package + "."):
            return False
        return any(part.startswith("_") for part in mod.split(".")[1:])

    def is_module(name: str) -> bool:  # by the package's files: a pydsa module is a file or a folder of the tree
        if not name.startswith("pydsa."):
            return False
        where = ROOT.joinpath(*name.split(".")[:-1])
        last = name.split(".")[-1]
        return (where / last / "__init__.py").exists() or any(where.glob(f"{last}.*"))

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[:len(parent) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            mods = [base] + [f"{base}.{a.name}" for a in node.names if is_module(f"{base}.{a.name}")]
        else:
            continue
        found += [f"{path.name}:{node.lineno} {m}" for m in mods if private(m)]
    return found


def test_the_sglang_layer_imports_only_public_pydsa_modules():
    """The adapter only translates (DESIGN.md): what it needs of the core has a public name (pydsa.c4_plan_decode,
    pydsa.c128_decode_records, pydsa.check_status, pydsa.metadata.MODE_DECODE, ...), and it imports no private
    pydsa module; its own helpers (pydsa.sglang._args) are its own."""
    files = sorted((ROOT / "pydsa" / "sglang").glob("*.py"))
    assert len(files) >= 6
    found = [hit for path in files for hit in _private_pydsa_imports(path)]
    assert not found, found


def test_the_private_import_check_itself_finds_each_form(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("import pydsa._abi\nfrom .. import _fill_c4_plan, __version__, c4\nfrom .._tensors import _int32\n"
                   "from pydsa._op import Prepared\nfrom ._args import memo\nfrom ..c4 import c4_plan_decode\n"
                   "from .compress import memo\n")
    assert [h.split(" ")[1] for h in _private_pydsa_imports(src)] == [
        "pydsa._abi", "pydsa._fill_c4_plan", "pydsa._tensors", "pydsa._op"]


def _imported_names(text: str) -> set:
    """The names a file's import statements bind (modules and what is imported from them)."""
    names = set()
    for m in re.finditer(r"^\s*(?:from\s+\S+\s+)?c?import\s+\(?([^)\n]*(?:\n[^)\n]*)*?)\)?\s*$", text, re.M):
        names |= {part.split()[-1].split(".")[0] for part in m[1].split(",") if part.strip()}
    return names


def test_the_objects_an_op_takes_are_recognised_by_type_not_by_registry_or_private_attributes():
    """KVCache, DevicePlan, C4Compressor, C128Ring are compiled classes of their fillers, which recognise them by type
    and read their fields: no module registers a class with the reader, and no module of the call path reads a
    private attribute of another object (such as a DevicePlan's `_records`)."""
    files = [f for f in sorted((ROOT / "pydsa").iterdir()) if f.suffix in (".py", ".pyx", ".pxd")]
    private = []
    for f in files:
        text = f.read_text()
        assert "register_type" not in text, f.name
        code = re.sub(r"#[^\n]*", "", re.sub(r'"""(.|\n)*?"""', "", text))
        known = _imported_names(text) | {"self", "cls"}
        for line in code.splitlines():
            if not re.match(r"\s*(from|import|cimport)\b", line):
                private += [f"{f.name}: {m[0]}" for m in re.finditer(r"(?<![\w.])([A-Za-z_]\w*)\._[a-z]\w*", line)
                            if m[1] not in known]
    assert private == []
    for cls in (pydsa.KVCache, pydsa.DevicePlan, pydsa.C4Compressor, pydsa.C128Ring):
        assert cls.__module__.startswith("pydsa._fill_"), cls


def test_c_structs_is_read_from_the_header_not_written_by_hand():
    """tests/c_structs.py writes no Structure itself: every typedef struct of the header is there, read from it."""
    source = (ROOT / "tests" / "c_structs.py").read_text()
    assert "_fields_ = [" not in source and not re.search(r"class \w+\((C|ctypes)\.Structure\)", source)
    header = c_structs.HEADER.read_text()
    declared = set(re.findall(r"typedef\s+struct\s+(\w+)\s*\{", header))
    assert declared and set(c_structs._structs) == declared


# A launch shape written where it is used, not named in native/src/launch_policy.h (where every shape sits with
# why): a numeric launch bound, a block or grid size defined from a number, a launch with numeric grid and block.
_SHAPE_IN_PLACE = [re.compile(r"__launch_bounds__\([^)]*?\b\d+"),
                   re.compile(r"constexpr\s+(?:unsigned\s+)?(?:int|int32_t|int64_t|uint32_t|uint64_t|unsigned|size_t)\s+"
                              r"k\w*(?:Threads|Warps|Blocks|Block)\s*[={]\s*\d"),
                   re.compile(r"\blaunch\([^;]*?,\s*\d+u?\s*,\s*\d+u?\s*,"),
                   re.compile(r"\blaunch\([^,;()]*(?:<[^;]*?>)?,\s*[^,;]+,\s*\d+u?\s*,"),
                   re.compile(r"\bdim3\(\s*\d+\s*[,)]"),
                   re.compile(r"<<<[^>]*?\d")]


def _shapes_in_place(text: str) -> list:
    return [m.group(0) for pattern in _SHAPE_IN_PLACE for m in pattern.finditer(text)]


def test_every_launch_shape_lives_in_the_launch_policy():
    found = {p.name: _shapes_in_place(p.read_text()) for p in sorted((ROOT / "native" / "src").iterdir())
             if p.suffix in (".cu", ".cuh", ".h", ".cpp") and p.name != "launch_policy.h"}
    assert len(found) >= 10 and "c4.cu" in found  # the kernels' sources were read
    assert not {k: v for k, v in found.items() if v}


@pytest.mark.parametrize("line", ["__global__ void __launch_bounds__(1024) kernel()",
                                  "__global__ void __launch_bounds__(kStore ? 512 : kDecodeThreads) kernel()",
                                  "constexpr int kCopyThreads = 256;", "constexpr uint32_t kThreadsPerBlock = 64;",
                                  "return launch(empty_kernel, 1, 32, stream, 0u);",
                                  "launch(kernel, dim3(1), dim3(kThreads), s, 0u, p)", "kernel<<<4, 128>>>(p);",
                                  "launch(kernel, dim3(blocks), 256, stream, 0u, p)", "launch(kernel, blocks, 128u, s, 0u)",
                                  "kernel<<<grid, 256>>>(p);", "constexpr int kBlock = 256;",
                                  "__global__ void __launch_bounds__(8) kernel()"])
def test_the_shape_check_finds_a_shape_in_place(line):
    assert _shapes_in_place(line)


@pytest.mark.parametrize("line", ["__global__ void __launch_bounds__(kPrefillThreads, kPrefillBlocksPerSm) kernel()",
                                  "constexpr int kPrefillWarps = kPrefillThreads / 32;",
                                  "launch(kernel, grid_of(shape), block_of(shape), stream, mode, a)"])
def test_the_shape_check_passes_a_named_shape(line):
    assert not _shapes_in_place(line)
