#!/usr/bin/python3
"""The Julia binding's test (Julia itself cannot run here: Debian 12 does not package it).

  (a) capi.jl is what gen/generate.py makes from the header today (generate.py --check);
  (b) every .jl file under bindings/julia parses: tree-sitter-julia finds no ERROR and no
      MISSING node;
  (c) capi.jl agrees with the header as SWIG reads it, through a type mapping and a
      reading of capi.jl written apart from the generator's: one wrapper per WEFT_API
      function whose ccall has the header's symbol, argument count, argument types and
      return type; the option structs, the DLPack structs (against the installed
      dlpack.h), the weft_status values, the version constants and the _INIT defaults;
  (d) the checks above fail on corrupted copies (a ccall with an argument dropped, a wrong
      type, a missing wrapper, syntax errors), so the test cannot pass vacuously;
  (e) the generator refuses, naming the declaration, headers it cannot map (an array
      parameter, an unknown type, an integer division in an _INIT, a syntax error, a
      misspelt _INIT, a // comment).

Run by Bazel (//bindings/julia:julia_binding_test) or by hand from the repository root:
    WEFT_NODE_MODULES=~/.cache/weft/node/node_modules /usr/bin/python3 \\
        bindings/julia/test/check_binding.py
WEFT_NODE_MODULES is the node_modules folder `./tools/weft.sh setup` fills.
"""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

# The generator's readers of SWIG's tree (its attributes, its type notation): one reading of
# SWIG's XML; what the test checks against it (the type mapping, capi.jl) is its own.
# (Bazel runs the test from the runfiles root, as a copy named after the target.)
sys.dont_write_bytecode = True  # no __pycache__ beside the generator
sys.path.insert(0, os.path.join(os.getcwd(), "bindings", "julia", "gen")
                if os.environ.get("TEST_SRCDIR") else
                os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gen"))
from generate import attributes, matching_paren, split_swig_type  # noqa: E402

HEADER_REL = "capi/include/weft/weft.h"
TRAINER_HEADER_REL = "capi/include/weft/trainer.h"
CAPI_REL = "bindings/julia/Weft/src/capi.jl"
GENERATOR_REL = "bindings/julia/gen/generate.py"
PARSER_REL = "bindings/julia/test/parse_julia.js"
JULIA_DIR_REL = "bindings/julia"
LIBRARY_EXPR = "libweft()"  # how every ccall in capi.jl names the library...
TRAINER_LIBRARY_EXPR = "libweft_trainer()"  # ...but those of trainer.h's functions
SETUP_HINT = "run ./tools/weft.sh setup (it installs tree-sitter into ~/.cache/weft/node)"


class SetupError(Exception):
    """Something the test needs is not installed: a failure, never a skip."""


def repo_root():
    if os.environ.get("TEST_SRCDIR"):
        return os.getcwd()  # Bazel runs tests from the workspace's runfiles folder
    # abspath, not realpath: keep to the tree this script was started from.
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))


def find_tool(name, env_var=None):
    path = os.environ.get(env_var) if env_var else None
    path = path or shutil.which(name)
    for fallback in ("/usr/bin/" + name, "/usr/local/bin/" + name):
        if not path and os.access(fallback, os.X_OK):
            path = fallback
    if not path:
        raise SetupError("cannot find `%s` (PATH=%s); %s" % (
            name, os.environ.get("PATH", ""), SETUP_HINT))
    return path


def node_modules_dir():
    modules = os.environ.get("WEFT_NODE_MODULES")
    if not modules:
        raise SetupError("WEFT_NODE_MODULES is not set; %s, and run the test through "
                         "./tools/weft.sh test (or pass --test_env=WEFT_NODE_MODULES=...)"
                         % SETUP_HINT)
    for package in ("tree-sitter", "tree-sitter-julia"):
        if not os.path.isfile(os.path.join(modules, package, "package.json")):
            raise SetupError("%s has no %s; %s" % (modules, package, SETUP_HINT))
    return modules


# ---- (a) the generator -------------------------------------------------------------------

def generator_problems(root, header, capi):
    proc = subprocess.run(
        [sys.executable, os.path.join(root, GENERATOR_REL), "--check", "--header", header,
         "--output", capi], capture_output=True, text=True)
    if proc.returncode == 0:
        return []
    return ["%s is not what %s generates from the header (exit %d):\n%s%s" % (
        capi, GENERATOR_REL, proc.returncode, proc.stdout[-6000:], proc.stderr)]


# ---- (b) tree-sitter ---------------------------------------------------------------------

def parse_julia(root, files):
    """{file: tree summary} from parse_julia.js."""
    proc = subprocess.run(
        [find_tool("node", "WEFT_NODE"), os.path.join(root, PARSER_REL),
         node_modules_dir()] + files, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SetupError("tree-sitter failed (exit %d): %s; %s" % (
            proc.returncode, proc.stderr.strip(), SETUP_HINT))
    return {t["file"]: t for t in json.loads(proc.stdout)}


def syntax_problems(trees, shown_names=None):
    problems = []
    for file, tree in trees.items():
        name = (shown_names or {}).get(file, file)
        for e in tree["errors"]:
            where = "%s:%d:%d" % (name, e["line"], e["column"])
            if e["kind"] == "MISSING":
                problems.append("%s: syntax error: missing %r" % (where, e["node"]))
            else:
                message = "%s: syntax error (a tree-sitter ERROR through line %d)" % (
                    where, e["end_line"])
                if e.get("last_piece"):
                    message += "; the last piece it could place is at line %d: %r" % (
                        e["last_piece"]["line"], e["last_piece"]["text"])
                problems.append(message)
    return problems


# ---- (c) the header as SWIG reads it -----------------------------------------------------

def run_swig(header, workdir, module):
    out = os.path.join(workdir, module + ".xml")
    # -xml writes SWIG's parse tree; SWIG does not follow #include without -includeall,
    # so dlpack.h is read on its own.
    proc = subprocess.run([find_tool("swig"), "-xml", "-module", module, "-o", out, header],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SetupError("swig could not read %s: %s" % (header, proc.stderr.strip()))
    return ET.parse(out).getroot()


class CModel:
    """Functions, structs, enums and constants of one header, from SWIG's tree."""

    def __init__(self, root):
        self.functions = {}  # name -> (return type, [parameter types]) in SWIG notation
        self.order = []
        self.structs = {}  # name -> [(field, SWIG type)]
        self.opaque = []  # typedef struct X X; with no body
        self.enums = set()
        self.enum_values = {}  # enumerator -> int
        self.constants = {}  # #define name -> int
        for node in root.iter():
            a = attributes(node)
            if node.tag == "cdecl" and a.get("kind") == "function":
                decl = a["decl"]  # f(<params>).<pointer part of the return type>
                close = matching_paren(decl, 1)
                ret = decl[close + 2:] + a["type"]
                params = [attributes(p)["type"] for p in node.iter("parm")]
                if params == ["void"]:
                    params = []
                self.functions[a["name"]] = (ret, params)
                self.order.append(a["name"])
            elif node.tag == "class":
                self.structs[a["name"]] = [
                    (attributes(m)["name"],
                     attributes(m).get("decl", "") + attributes(m)["type"])
                    for m in node.findall("cdecl")
                    if attributes(m).get("kind") == "variable"]
            elif node.tag == "enum":
                for key in ("name", "tdname", "sym_name"):
                    if a.get(key):
                        self.enums.add(a[key])
            elif node.tag == "enumitem":
                self.enum_values[a["name"]] = int(a["enumvalue"].rstrip("uUlL"))
            elif node.tag == "constant":
                self.constants[a["name"]] = eval_int(a["value"], {})
        for node in root.iter("cdecl"):
            a = attributes(node)
            if a.get("kind") == "typedef" and a.get("type", "").startswith("struct ") \
                    and a["name"] not in self.structs:
                self.opaque.append(a["name"])


def eval_int(expr, names):
    """An integer expression of literals, names and + - * / ( ): its value."""
    tree = ast.parse(re.sub(r"(\d+)[uUlL]+\b", r"\1", expr.strip()), mode="eval")

    def value(n):
        if isinstance(n, ast.Expression):
            return value(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name) and n.id in names:
            return names[n.id]
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and len(n.args) == 1 \
                and n.func.id in ("Cint", "Cuint", "UInt8", "Int", "Int32", "UInt16"):
            return value(n.args[0])  # Julia's Cint(1): a typed integer
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -value(n.operand)
        if isinstance(n, ast.BinOp):
            ops = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y,
                   ast.Mult: lambda x, y: x * y, ast.Div: lambda x, y: x // y}
            if type(n.op) in ops:
                return ops[type(n.op)](value(n.left), value(n.right))
        raise ValueError("not an integer expression: %r" % expr)

    return value(tree)


# C spellings -> Julia, written independently of the generator's table.
SWIG_BASE_TO_JULIA = {
    "void": "Cvoid", "char": "Cchar", "int": "Cint", "unsigned int": "Cuint",
    "size_t": "Csize_t", "double": "Cdouble", "float": "Cfloat",
    "int8_t": "Int8", "uint8_t": "UInt8", "int16_t": "Int16", "uint16_t": "UInt16",
    "int32_t": "Int32", "uint32_t": "UInt32", "int64_t": "Int64", "uint64_t": "UInt64",
}


def julia_type_for(swig_type, role, enums, known_structs):
    """The Julia type capi.jl must use for a C type in SWIG notation. role: 'param',
    'return' or 'field'. A const char* parameter is a Cstring; returned strings, char**
    and char* buffers the callee writes stay pointers (they may be NULL, and out-parameters
    are written by C)."""
    parts = split_swig_type(swig_type)
    depth = 0
    const = False  # the pointee (the innermost qualifier SWIG lists) is const
    while parts and (parts[0] == "p" or parts[0].startswith("q(")):
        depth += parts[0] == "p"
        const = parts[0].startswith("q(") and "const" in parts[0]
        parts.pop(0)
    if parts and parts[0].startswith("f("):
        if depth != 1:
            raise ValueError("unsupported function type %r" % swig_type)
        return "Ptr{Cvoid}"
    base = ".".join(parts)
    base = re.sub(r"^(struct|enum) ", "", base)
    if base in enums:
        jl = "Cint"  # a C enum is an int
    elif base in SWIG_BASE_TO_JULIA:
        jl = SWIG_BASE_TO_JULIA[base]
    elif base in known_structs:
        jl = base
    else:
        raise ValueError("no Julia mapping for C type %r" % swig_type)
    if role == "param" and base == "char" and depth == 1 and const:
        return "Cstring"
    return "Ptr{" * depth + jl + "}" * depth


def compact(text):
    return re.sub(r"\s+", "", text)


def exported_function_count(header_text):
    """How many declarations carry WEFT_API (comments and #define lines removed)."""
    code = re.sub(r"/\*.*?\*/", " ", header_text, flags=re.S)
    code = re.sub(r"\\\n", " ", code)
    code = "\n".join(l for l in code.split("\n") if not l.lstrip().startswith("#"))
    return len(re.findall(r"\bWEFT_API\b", code))


def trainer_functions(header_text):
    """The functions after trainer.h's include guard: they live in libweft_trainer."""
    start = header_text.find("#define WEFT_TRAINER_H_")
    if start < 0:
        return set()
    return set(re.findall(r"WEFT_API[^;(]*?\b(weft_\w+)\s*\(", header_text[start:]))


def combined_header(root, workdir):
    """weft.h and trainer.h as one file (trainer.h adds to weft.h), for SWIG and the
    checks: (path, text)."""
    texts = []
    for rel in (HEADER_REL, TRAINER_HEADER_REL):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            texts.append(f.read())
    text = "\n".join(texts)
    path = os.path.join(workdir, "weft_and_trainer.h")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path, text


def header_inits(header_text):
    """{struct name: [C initializer values]} from the WEFT_*_INIT macros."""
    inits = {}
    header_text = re.sub(r"\\\n", " ", header_text)  # macros continued over lines
    for m in re.finditer(r"#define\s+(WEFT_\w+)_INIT\s*\\?\s*\{([^}]*)\}", header_text):
        inits[m.group(1).lower()] = [v.strip() for v in m.group(2).split(",")]
    return inits


def signature_problems(weft, dlpack, header_text, tree, shown_name):
    """Everything capi.jl must agree on with the header; a list of messages."""
    problems = []
    enums = weft.enums | dlpack.enums
    structs = set(weft.structs) | set(weft.opaque) | set(dlpack.structs)

    # Every function SWIG found must be one of the WEFT_API ones, and none missed.
    n_exported = exported_function_count(header_text)
    if n_exported != len(weft.functions):
        problems.append("%s has %d WEFT_API declarations but SWIG read %d functions" % (
            HEADER_REL, n_exported, len(weft.functions)))

    by_symbol = {}
    for call in tree["ccalls"]:
        by_symbol.setdefault(call.get("symbol"), []).append(call)
    for symbol, calls in sorted(by_symbol.items(), key=lambda kv: str(kv[0])):
        if symbol not in weft.functions:
            for call in calls:
                problems.append("%s:%d: ccall of %s, which is not a WEFT_API function of %s"
                                % (shown_name, call["line"], symbol, HEADER_REL))
        elif len(calls) > 1:
            problems.append("%s: %d ccalls of %s; expected one wrapper" % (
                shown_name, len(calls), symbol))

    for name in weft.order:
        ret, params = weft.functions[name]
        calls = by_symbol.get(name)
        if not calls:
            problems.append("%s: no wrapper for %s (%d arguments)" % (
                shown_name, name, len(params)))
            continue
        call = calls[0]
        where = "%s:%d: %s" % (shown_name, call["line"], name)
        try:
            want_ret = julia_type_for(ret, "return", enums, structs)
            want = [julia_type_for(p, "param", enums, structs) for p in params]
        except ValueError as e:
            problems.append("%s: %s" % (where, e))
            continue
        library = (TRAINER_LIBRARY_EXPR if name in trainer_functions(header_text)
                   else LIBRARY_EXPR)
        if call.get("library") != library:
            problems.append("%s: library is %r, expected %s" % (
                where, call.get("library"), library))
        if call.get("types_kind") != "tuple_expression":
            problems.append("%s: the argument types are a %s, not a tuple (a 1-tuple needs "
                            "a trailing comma)" % (where, call.get("types_kind")))
            continue
        got_ret = compact(call["ret"]["text"])
        if got_ret != want_ret:
            problems.append("%s: returns %s, the header says %s (%s)" % (
                where, got_ret, want_ret, ret))
        got = [compact(t["text"]) for t in call["types"]["items"]]
        if len(got) != len(want):
            problems.append("%s: ccall declares %d argument types, the header has %d "
                            "parameters" % (where, len(got), len(want)))
        else:
            for k, (g, w) in enumerate(zip(got, want)):
                if g != w:
                    problems.append("%s: argument %d is %s, the header says %s (%s)" % (
                        where, k + 1, g, w, params[k]))
        values = [v["text"] for v in call["values"]]
        if len(values) != len(got):
            problems.append("%s: ccall passes %d values for %d argument types" % (
                where, len(values), len(got)))
        fn = call.get("enclosing")
        if not fn or fn["name"] != name:
            problems.append("%s: the ccall is not inside a function named %s" % (
                where, name))
        elif fn["params"] != values:
            problems.append("%s: %s(%s) passes (%s) to C; expected its parameters in order"
                            % (where, name, ", ".join(fn["params"]), ", ".join(values)))

    julia_structs = {s["name"]: s for s in tree["structs"]}
    for model, label in ((weft, HEADER_REL), (dlpack, "dlpack.h")):
        for name, fields in model.structs.items():
            s = julia_structs.get(name)
            if s is None:
                problems.append("%s: no struct %s (%s)" % (shown_name, name, label))
                continue
            where = "%s:%d: struct %s" % (shown_name, s["line"], name)
            if s["mutable"]:
                problems.append("%s: must be an immutable struct (C reads it by pointer)"
                                % where)
            want = []
            for fname, ftype in fields:
                try:
                    want.append((fname, julia_type_for(ftype, "field", enums, structs)))
                except ValueError as e:
                    problems.append("%s: field %s: %s" % (where, fname, e))
            got = [(f["name"], compact(f["type"])) for f in s["fields"]]
            if got != want:
                problems.append("%s: fields %s, expected %s (%s)" % (
                    where, fmt_fields(got), fmt_fields(want), label))
    for name in weft.opaque:
        s = julia_structs.get(name)
        if s is None or s["fields"] or s["others"]:
            problems.append("%s: expected an opaque `mutable struct %s end`" % (
                shown_name, name))

    consts = {c["name"]: c for c in tree["consts"]}
    # Constants may refer to ones defined before them: evaluate in file order.
    values = {}
    for c in tree["consts"]:
        try:
            values[c["name"]] = eval_int(c["value"], values)
        except (ValueError, SyntaxError):
            pass
    for label, expected in (("weft_status", weft.enum_values), ("#define", weft.constants)):
        for name, value in expected.items():
            if name not in consts:
                problems.append("%s: no constant %s (%s)" % (shown_name, name, label))
            elif values.get(name) != value:
                problems.append("%s:%d: %s = %s, the header says %d" % (
                    shown_name, consts[name]["line"], name, consts[name]["value"], value))
    for name in ("kDLCPU", "kDLInt", "kDLUInt", "kDLFloat"):
        if name not in consts:
            problems.append("%s: no constant %s (dlpack.h)" % (shown_name, name))
    for name in consts:
        if name.startswith("kDL") and values.get(name) != dlpack.enum_values.get(name):
            problems.append("%s:%d: %s = %s, dlpack.h says %s" % (
                shown_name, consts[name]["line"], name, consts[name]["value"],
                dlpack.enum_values.get(name)))

    problems += init_problems(weft, header_text, tree, shown_name)
    return problems


def fmt_fields(fields):
    return "(" + ", ".join("%s::%s" % f for f in fields) + ")"


def init_problems(weft, header_text, tree, shown_name):
    """Each option struct's keyword constructor has the _INIT macro's defaults."""
    problems = []
    constructors = {f["name"]: f for f in tree["kwfunctions"]}
    for struct, values in header_inits(header_text).items():
        fields = [f for f, _ in weft.structs.get(struct, [])]
        if len(fields) != len(values):
            problems.append("%s: %s_INIT has %d values for %d fields" % (
                HEADER_REL, struct.upper(), len(values), len(fields)))
            continue
        f = constructors.get(struct)
        if f is None:
            problems.append("%s: no keyword constructor %s(; ...) for %s_INIT" % (
                shown_name, struct, struct.upper()))
            continue
        where = "%s:%d: %s(; ...)" % (shown_name, f["line"], struct)
        want_kwargs = [(n, v) for n, v in zip(fields, values) if n != "version"]
        got_kwargs = [(k["name"], k["value"]) for k in f["kwargs"]]
        if [n for n, _ in got_kwargs] != [n for n, _ in want_kwargs]:
            problems.append("%s: keywords %s, expected %s" % (
                where, [n for n, _ in got_kwargs], [n for n, _ in want_kwargs]))
        else:
            for (n, got), (_, want) in zip(got_kwargs, want_kwargs):
                if not same_c_value(got, want):
                    problems.append("%s: %s defaults to %s, the _INIT macro says %s" % (
                        where, n, got, want))
        calls = [c for c in f["calls"] if c["callee"] == struct]
        want_args = [v if n == "version" else n for n, v in zip(fields, values)]
        if len(calls) != 1 or calls[0]["args"] != want_args:
            problems.append("%s: should return %s(%s)" % (
                where, struct, ", ".join(want_args)))
    return problems


def same_c_value(julia, c):
    if c == "NULL":
        return julia == "C_NULL"
    try:
        return float(julia) == float(c)
    except ValueError:
        return julia == c


# ---- (d) the checker must catch corrupted copies -----------------------------------------

def remove_item(text, items, k):
    """Removes items[k] from a comma-separated list in text, with one comma."""
    if k + 1 < len(items):
        start, end = items[k]["start"], items[k + 1]["start"]
    else:
        start, end = items[k - 1]["end"], items[k]["end"]
    return text[:start] + text[end:]


def self_test(root, capi_text, capi_tree, weft, dlpack, header_text, workdir):
    """Corrupts copies of capi.jl and requires each corruption to be reported."""
    calls = {c["symbol"]: c for c in capi_tree["ccalls"]}

    def ccall_of(name):
        call = calls[name]
        assert capi_text[call["start"]:call["end"]].startswith("ccall("), \
            "tree-sitter offsets do not index the source as expected"
        return call

    cases = []
    # A ccall with one argument dropped (its type and its value): the arity check.
    call = ccall_of("weft_comm_allreduce")
    text = capi_text
    for items in (call["values"], call["types"]["items"]):  # later in the text first
        text = remove_item(text, items, 2)
    cases.append(("an argument dropped", text, "signature", "weft_comm_allreduce"))
    # A wrong type (double -> float).
    call = ccall_of("weft_topology_add_edge")
    item = call["types"]["items"][3]
    assert item["text"] == "Cdouble"
    text = capi_text[:item["start"]] + "Cfloat" + capi_text[item["end"]:]
    cases.append(("a wrong argument type", text, "signature", "weft_topology_add_edge"))
    # A wrong return type.
    call = ccall_of("weft_version")
    text = capi_text[:call["ret"]["start"]] + "Cstring" + capi_text[call["ret"]["end"]:]
    cases.append(("a wrong return type", text, "signature", "weft_version"))
    # A missing wrapper: the whole function around weft_comm_barrier's ccall.
    call = ccall_of("weft_comm_barrier")
    start = capi_text.rindex("\nfunction weft_comm_barrier()", 0, call["start"])
    end = capi_text.index("\nend\n", call["end"]) + len("\nend")
    text = capi_text[:start] + capi_text[end:]
    cases.append(("a missing wrapper", text, "signature", "weft_comm_barrier"))
    # A syntax error: the closing parenthesis of a ccall.
    call = ccall_of("weft_rank")
    text = capi_text[:call["end"] - 1] + capi_text[call["end"]:]
    cases.append(("an unclosed ccall", text, "syntax", ":"))
    # A syntax error: a function without its end.
    text = capi_text.replace("\nend  # module CAPI", "\nfunction broken(x)\n    x +\n"
                             "end  # module CAPI")
    cases.append(("a function without end", text, "syntax", ":"))

    files = []
    for k, (_, text, _, _) in enumerate(cases):
        path = os.path.join(workdir, "corrupt%d.jl" % k)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        files.append(path)
    trees = parse_julia(root, files)
    header = os.path.join(root, HEADER_REL)
    failures, report = [], []
    for (label, _, kind, needle), path in zip(cases, files):
        shown = "capi.jl (%s)" % label
        if kind == "syntax":
            found = syntax_problems({path: trees[path]}, {path: shown})
        else:
            found = signature_problems(weft, dlpack, header_text, trees[path], shown)
        found_gen = generator_problems(root, header, path)
        hit = [p for p in found if needle in p]
        report.append("  %-26s -> %d problem(s) reported, e.g. %s" % (
            label, len(found), (hit or found or ["(none)"])[0].splitlines()[0][:110]))
        if not hit:
            failures.append("the checker missed %s: expected a %s problem naming %r, got %s"
                            % (label, kind, needle, found or "none"))
        if not found_gen:
            failures.append("generate.py --check accepted a capi.jl with %s" % label)
    return failures, report


def refusal_test(root, workdir):
    """The generator stops, naming the declaration, on headers it cannot map, instead of
    writing a half-right capi.jl: ([failures], [report lines])."""
    with open(os.path.join(root, HEADER_REL), encoding="utf-8") as f:
        header_text = f.read()
    cases = [
        ("an array parameter", "WEFT_API int weft_rank(void);",
         "WEFT_API int weft_rank(int ranks[4]);", "weft_rank(ranks): unsupported type"),
        ("an unknown type", "WEFT_API int weft_size(void);",
         "WEFT_API int weft_size(struct unknown_thing* thing);",
         "weft_size(thing): unknown C type 'unknown_thing'"),
        ("an integer division in an _INIT", "{ WEFT_PIPE_FREEZE_OPTIONS_VERSION, 1.0 / 3.0,",
         "{ WEFT_PIPE_FREEZE_OPTIONS_VERSION, 1 / 3,",
         "cannot translate '1 / 3' in WEFT_PIPE_FREEZE_OPTIONS_INIT"),
        ("a syntax error", "WEFT_API int weft_size(void);", "WEFT_API int weft_size(void",
         "swig could not read the header"),
        ("a misspelt _INIT", "#define WEFT_WIN_CREATE_OPTIONS_INIT",
         "#define WEFT_WIN_CREATE_OPTION_INIT",
         "WEFT_WIN_CREATE_OPTION_INIT: there is no struct weft_win_create_option"),
        ("a // comment", "/* These return -1 before weft_init(). */",
         "// These return -1 before weft_init().", "a // comment"),
    ]
    failures, report = [], []
    for k, (label, old, new, needle) in enumerate(cases):
        if header_text.count(old) != 1:
            failures.append("refusal test %r: %r is not in %s once" % (label, old, HEADER_REL))
            continue
        path = os.path.join(workdir, "refused%d.h" % k)
        with open(path, "w", encoding="utf-8") as f:
            f.write(header_text.replace(old, new))
        proc = subprocess.run(
            [sys.executable, os.path.join(root, GENERATOR_REL), "--header", path,
             "--output", os.path.join(workdir, "refused%d.jl" % k)],
            capture_output=True, text=True)
        said = (proc.stderr.strip().splitlines() or ["(nothing)"])[0]
        report.append("  %-34s -> exit %d: %s" % (label, proc.returncode, said[:100]))
        if proc.returncode != 2 or needle not in proc.stderr:
            failures.append("generate.py on a header with %s: expected exit 2 naming %r, got "
                            "exit %d: %s" % (label, needle, proc.returncode, proc.stderr))
    return failures, report


# ---- main --------------------------------------------------------------------------------

def julia_files(root):
    found = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, JULIA_DIR_REL)):
        dirnames.sort()
        found += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".jl")]
    return found


def find_dlpack_header():
    for include in ("/usr/include", "/usr/local/include"):
        path = os.path.join(include, "dlpack", "dlpack.h")
        if os.path.isfile(path):
            return path
    raise SetupError("dlpack/dlpack.h not found (apt-get install libdlpack-dev)")


def main():
    root = repo_root()
    header = os.path.join(root, HEADER_REL)
    capi = os.path.join(root, CAPI_REL)
    workdir = tempfile.mkdtemp(prefix="julia_binding_", dir=os.environ.get("TEST_TMPDIR"))
    problems = []
    try:
        node_modules_dir()  # fail early, with the set-up hint
        combined, header_text = combined_header(root, workdir)
        with open(capi, encoding="utf-8") as f:
            capi_text = f.read()

        problems += generator_problems(root, header, capi)

        files = julia_files(root)
        if capi not in files:
            problems.append("%s is missing" % CAPI_REL)
        trees = parse_julia(root, files)
        rel = {f: os.path.relpath(f, root) for f in files}
        problems += syntax_problems(trees, rel)

        weft = CModel(run_swig(combined, workdir, "weft"))
        dlpack = CModel(run_swig(find_dlpack_header(), workdir, "dlpack"))
        if not weft.functions:
            problems.append("SWIG found no functions in %s" % HEADER_REL)
        capi_tree = trees[capi]
        problems += signature_problems(weft, dlpack, header_text, capi_tree, CAPI_REL)

        failures, report = self_test(root, capi_text, capi_tree, weft, dlpack, header_text,
                                     workdir)
        problems += failures
        failures, refusals = refusal_test(root, workdir)
        problems += failures
    except SetupError as e:
        print("FAIL: %s" % e)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print("checked %d .jl files with tree-sitter-julia" % len(files))
    print("checked %d WEFT_API functions, %d structs, %d opaque types, %d constants of %s "
          "against SWIG's reading" % (len(weft.functions), len(weft.structs) +
                                      len(dlpack.structs), len(weft.opaque),
                                      len(weft.enum_values) + len(weft.constants),
                                      HEADER_REL))
    print("self-test on corrupted copies of capi.jl:")
    print("\n".join(report))
    print("the generator on headers it cannot map:")
    print("\n".join(refusals))
    if problems:
        print("\nFAIL: %d problem(s):" % len(problems))
        for p in problems:
            print("  " + p)
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
