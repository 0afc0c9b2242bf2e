#!/usr/bin/python3
"""Generates the Julia mirror of weft's C ABI.

Reads capi/include/weft/weft.h and trainer.h and writes bindings/julia/Weft/src/capi.jl:
one Julia function per WEFT_API function (a ccall with the exact C types), the structs the
functions take (the DLPack structs and weft's option structs), the enums' values and the
integer macros as constants, and a keyword constructor per option struct with its _INIT
macro's defaults.

    /usr/bin/python3 bindings/julia/gen/generate.py            # (re)write capi.jl
    /usr/bin/python3 bindings/julia/gen/generate.py --check    # exit 1 with a diff if stale

SWIG reads the header (`swig -xml`, the same reading the Python and Go bindings are built
from): every declaration, type, enum value and macro value comes from its tree, the _INIT
values included (SWIG's preprocessor expands each one in a constant this script declares).
The header's text is only searched for what the tree leaves out: the comments, which
become the docs, and each function's declaration as written, for its "C:" line. A
construct the mapping does not know (an array parameter, an unknown type, a value it
cannot translate) stops the script with an error naming it: a binding generated from a
half-understood header is worse than none. The output depends on the headers and SWIG
alone (4.1, Debian 12's), so it is deterministic.
"""

import argparse
import ast
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET

# Paths relative to the repository root (this file is bindings/julia/gen/generate.py).
# abspath, not realpath: under Bazel the script is a symlink in a runfiles tree.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
HEADER_REL = "capi/include/weft/weft.h"
TRAINER_HEADER_REL = "capi/include/weft/trainer.h"
OUTPUT_REL = "bindings/julia/Weft/src/capi.jl"
GENERATOR_REL = "bindings/julia/gen/generate.py"


class HeaderError(Exception):
    """The header has a construct this generator does not understand."""

    def __init__(self, line, message, path=None):
        super().__init__(message)
        self.line = line  # 0 when the problem is not on one line
        self.path = path  # the header, when known


# ---- C types -> Julia types --------------------------------------------------------------

# Scalar C types by spelling (qualifiers removed). Enums are C ints on every ABI Julia runs
# on, so weft_status is Cint.
C_SCALARS = {
    "void": "Cvoid",
    "char": "Cchar",
    "int": "Cint",
    "unsigned int": "Cuint",
    "unsigned": "Cuint",
    "size_t": "Csize_t",
    "double": "Cdouble",
    "float": "Cfloat",
    "int8_t": "Int8",
    "uint8_t": "UInt8",
    "int16_t": "Int16",
    "uint16_t": "UInt16",
    "int32_t": "Int32",
    "uint32_t": "UInt32",
    "int64_t": "Int64",
    "uint64_t": "UInt64",
}

# Names Julia does not accept as a plain argument name.
JULIA_RESERVED = {
    "abstract", "baremodule", "begin", "break", "catch", "const", "continue", "do",
    "else", "elseif", "end", "export", "false", "finally", "for", "function", "global",
    "if", "import", "in", "isa", "let", "local", "macro", "module", "mutable", "outer",
    "primitive", "public", "quote", "return", "struct", "true", "try", "type", "using",
    "where", "while",
}

# DLPack (dlpack/dlpack.h) is part of the ABI but not of weft.h. Its struct layout has been
# stable since v0.6 (DLDevice), so the mirror is written down here rather than read from
# whichever dlpack.h is installed: the output must not depend on the machine. The binding
# test checks these against the installed dlpack.h.
DLPACK_STRUCTS = [
    ("DLDevice", "The device of a tensor: device_type is a DLDeviceType (kDLCPU).", [
        ("device_type", "Cint", "DLDeviceType, a C enum"),
        ("device_id", "Cint", None),
    ]),
    ("DLDataType", "Element type: code is kDLInt, kDLUInt, kDLFloat or kDLBfloat; bits per "
                   "element; lanes 1.", [
        ("code", "UInt8", None),
        ("bits", "UInt8", None),
        ("lanes", "UInt16", None),
    ]),
    ("DLTensor", "A tensor that does not own its memory; strides NULL means compact "
                 "row-major.", [
        ("data", "Ptr{Cvoid}", None),
        ("device", "DLDevice", None),
        ("ndim", "Cint", None),
        ("dtype", "DLDataType", None),
        ("shape", "Ptr{Int64}", None),
        ("strides", "Ptr{Int64}", None),
        ("byte_offset", "UInt64", None),
    ]),
    ("DLManagedTensor", "A tensor with an owner: call deleter(self) when done with it.", [
        ("dl_tensor", "DLTensor", None),
        ("manager_ctx", "Ptr{Cvoid}", None),
        ("deleter", "Ptr{Cvoid}", "void (*)(struct DLManagedTensor* self)"),
    ]),
]
DLPACK_CONSTANTS = [
    ("kDLCPU", "Cint(1)", "DLDeviceType: host memory"),
    ("kDLInt", "UInt8(0)", "DLDataTypeCode: signed integer"),
    ("kDLUInt", "UInt8(1)", "DLDataTypeCode: unsigned integer"),
    ("kDLFloat", "UInt8(2)", "DLDataTypeCode: IEEE floating point"),
    ("kDLBfloat", "UInt8(4)", "DLDataTypeCode: bfloat16"),
]


def julia_name(name):
    return name + "_" if name in JULIA_RESERVED else name


class TypeMapper:
    """Maps a C type, in SWIG's notation, to a Julia type."""

    def __init__(self):
        self.structs = {"DLTensor", "DLManagedTensor", "DLDevice", "DLDataType"}
        self.enums = set()

    def julia_type(self, swig_type, role, where):
        """swig_type: SWIG's spelling of a C type, outermost part first ('p.q(const).char'
        is const char*, 'p.f(p.void).void' a pointer to a function). role: 'param' (a
        const char* is a Cstring; a char* buffer the callee writes stays Ptr{Cchar}),
        'return' or 'field'."""
        parts = split_swig_type(swig_type)
        depth, const = 0, False  # const: the pointee (the innermost qualifier) is const
        while parts and (parts[0] == "p" or parts[0].startswith("q(")):
            depth += parts[0] == "p"
            const = parts[0].startswith("q(") and "const" in parts[0]
            parts.pop(0)
        if parts and parts[0].startswith("f("):
            if depth != 1:
                raise HeaderError(0, "%s: unsupported function type %r" % (where, swig_type))
            return "Ptr{Cvoid}"  # a C function pointer, e.g. from @cfunction
        if any(not re.fullmatch(r"[\w ]+", p) for p in parts):
            raise HeaderError(0, "%s: unsupported type %r (arrays, references)" % (
                where, swig_type))
        base = re.sub(r"^(struct|enum) ", "", ".".join(parts))
        if base in self.enums:
            jl = "Cint"  # C enums are ints on every ABI Julia runs on
        elif base in C_SCALARS:
            jl = C_SCALARS[base]
        elif base in self.structs:
            jl = base
        else:
            raise HeaderError(0, "%s: unknown C type %r" % (where, base))
        if role == "param" and base == "char" and depth == 1 and const:
            # Julia checks a Cstring argument for embedded NULs and passes it NUL-ended.
            # Returned strings (and char** out-parameters) stay Ptr{Cchar}: they may be
            # NULL and are read with unsafe_string.
            return "Cstring"
        for _ in range(depth):
            jl = "Ptr{%s}" % jl
        return jl


def split_swig_type(swig_type):
    """'p.q(const).char' -> ['p', 'q(const)', 'char'] (dots inside parentheses kept)."""
    parts, depth, cur = [], 0, ""
    for c in swig_type:
        if c == "." and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"(": 1, ")": -1}.get(c, 0)
        cur += c
    if cur:
        parts.append(cur)
    return parts


# ---- reading the header: SWIG ------------------------------------------------------------

# What SWIG's tree leaves out is the header's comments and the values of brace-initializer
# macros. The values come from SWIG too: the interface declares one constant per option
# struct, initialized with the struct's _INIT macro, and SWIG's preprocessor expands it.
INIT_PROBE = "weft_julia_init__"


def find_swig():
    path = shutil.which("swig")
    for fallback in ("/usr/bin/swig", "/usr/local/bin/swig"):
        if not path and os.access(fallback, os.X_OK):
            path = fallback
    if not path:
        raise HeaderError(0, "cannot find swig, which reads the header for this generator "
                             "(./tools/weft.sh setup installs it)")
    return path


def attributes(node):
    found = node.find("attributelist")
    if found is None:
        return {}
    return {a.get("name"): a.get("value") for a in found.findall("attribute")}


def run_swig(interface, workdir):
    iface = os.path.join(workdir, "weft_julia.i")
    with open(iface, "w", encoding="utf-8") as f:
        f.write(interface)
    out = os.path.join(workdir, "weft_julia.xml")
    proc = subprocess.run([find_swig(), "-xml", "-o", out, iface], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise HeaderError(0, "swig could not read the header:\n" + proc.stderr.strip())
    return ET.parse(out).getroot()


def read_with_swig(headers):
    """SWIG's reading of the headers, in order: ({path: [top-level nodes of that file]},
    {struct name: [its _INIT macro's values, as SWIG expanded them]})."""
    interface = "%module weft_julia\n" + "".join('%%include "%s"\n' % h for h in headers)
    with tempfile.TemporaryDirectory(prefix="weft_julia_",
                                     dir=os.environ.get("TEST_TMPDIR")) as workdir:
        root = run_swig(interface, workdir)
        structs = [attributes(n)["name"] for n in root.iter("class")]
        struct_path = {attributes(n)["name"]: attributes(include).get("name")
                       for include in root.iter("include") for n in include
                       if n.tag == "class"}
        probes = "".join(
            "#ifdef %s_INIT\nstatic const %s %s%s = %s_INIT;\n#endif\n" % (
                s.upper(), s, INIT_PROBE, s, s.upper()) for s in structs)
        root = run_swig(interface + probes, workdir)
    files = {}
    for include in root.iter("include"):
        name = attributes(include).get("name")
        if name in headers:
            files[name] = [n for n in include if n.tag != "attributelist"]
    missing = [h for h in headers if h not in files]
    if missing:
        raise HeaderError(0, "SWIG's tree has no part for %s" % ", ".join(missing))
    inits = {}
    for node in root.iter("cdecl"):
        a = attributes(node)
        if a.get("name", "").startswith(INIT_PROBE):
            value = a.get("value", "").strip()
            if not (value.startswith("{") and value.endswith("}")):
                struct = a["name"][len(INIT_PROBE):]
                raise HeaderError(0, "%s_INIT is not a brace initializer: %r" % (
                    struct.upper(), value), struct_path.get(struct))
            inits[a["name"][len(INIT_PROBE):]] = split_top_level(value[1:-1])
    return files, inits


# ---- the header's text: comments ---------------------------------------------------------

def comment_lines(comment):
    """'/* a\n * b */' -> ['a', 'b']."""
    body = comment[2:-2]
    lines = []
    for raw in body.split("\n"):
        raw = raw.strip()
        if raw.startswith("*"):
            raw = raw[1:]
            if raw.startswith(" "):
                raw = raw[1:]
        lines.append(raw.rstrip())
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


SECTION_RE = re.compile(r"^-{2,}\s*(.*?)\s*-*$")


class HeaderText:
    """One header's text, for what SWIG's tree does not keep: the comments (a declaration's
    doc is the comment just above it; a one-line "---- title ----" comment starts a
    section; a member's comment is the one on its line), and each function's spelling for
    the "C:" line. Lexical only: it finds comments and where SWIG's declarations are
    written, and never reads a declaration's meaning."""

    def __init__(self, path, text):
        self.path = path
        self.text = text
        self.comments = [(m.start(), m.end()) for m in re.finditer(r"/\*.*?\*/", text, re.S)]
        # The text with every comment blanked out (same offsets), where declarations are
        # looked for.
        code = list(text)
        for start, end in self.comments:
            for k in range(start, end):
                if code[k] != "\n":
                    code[k] = " "
        self.code = "".join(code)
        line_comment = self.code.find("//")
        if line_comment >= 0:
            # Docs come from /* */ comments; a // comment would be lost without a word.
            raise self.error(line_comment, "a // comment: write comments as /* ... */, which "
                                           "this generator reads as docs")
        self.bodies = []  # (start, end) of the struct and enum bodies read so far
        # The file's opening comment describes the header; capi.jl points at it instead.
        self.preamble = self.comments[0] if self.comments and \
            not text[:self.comments[0][0]].strip() else None

    def line(self, offset):
        return self.text.count("\n", 0, offset) + 1

    def error(self, offset, message):
        return HeaderError(self.line(offset), message, self.path)

    def find(self, pattern, what):
        """The one place `pattern` matches outside comments."""
        found = list(re.finditer(pattern, self.code, re.M))
        if len(found) != 1:
            raise HeaderError(0, "%s %s (SWIG read it)" % (
                what, "is written %d times" % len(found) if found else "cannot be found"),
                self.path)
        return found[0]

    def sections(self):
        """[(offset, title)] of the section banners (outside struct and enum bodies)."""
        found = []
        for start, end in self.comments:
            if any(b_start <= start < b_end for b_start, b_end in self.bodies):
                continue
            lines = comment_lines(self.text[start:end])
            m = SECTION_RE.match(lines[0]) if len(lines) == 1 else None
            if m:
                found.append((start, m.group(1)))
        return found

    def doc_before(self, offset):
        """The lines of the comment just above `offset` (nothing but blank space between),
        unless it is a section banner or the file's opening comment."""
        for start, end in reversed(self.comments):
            if end > offset:
                continue
            if self.text[end:offset].strip() or (start, end) == self.preamble:
                return []
            lines = comment_lines(self.text[start:end])
            if len(lines) == 1 and SECTION_RE.match(lines[0]):
                return []
            return lines
        return []

    def matching_brace(self, at, step, what):
        """The offset of the brace matching the one at `at`: scanning forward from a "{"
        (step 1) or backward from a "}" (step -1)."""
        depth = 0
        for k in range(at, len(self.code) if step > 0 else -1, step):
            depth += {"{": step, "}": -step}.get(self.code[k], 0)
            if depth == 0:
                return k
        raise self.error(at, "%s: unbalanced braces" % what)

    def braced_typedef(self, keyword, tag, name):
        """`typedef <keyword> <tag> { ... } <name>;` (tag None: an anonymous one): the
        offset where it starts, and the text between its braces, comments included."""
        what = "%s %s" % (keyword, name)
        if tag is not None:
            open_at = self.find(r"\btypedef\s+%s\s+%s\s*\{" % (keyword, tag), what).end() - 1
            close_at = self.matching_brace(open_at, 1, what)
        else:
            close_at = self.find(r"\}\s*%s\s*;" % name, what).start()
            open_at = self.matching_brace(close_at, -1, what)
        start = self.code.rfind("typedef", 0, open_at)
        if start < 0 or not re.fullmatch(r"typedef\s+%s(\s+\w+)?\s*" % keyword,
                                         self.code[start:open_at]):
            raise self.error(open_at, "%s: expected typedef %s { ... } %s;" % (
                what, keyword, name))
        self.bodies.append((open_at, close_at))
        return start, self.text[open_at + 1:close_at]


def members_with_comments(body):
    """The members of a braced enum or struct body, each as (code, comment or None).
    A comment on a member's line, after it, is that member's; any other comment goes to
    the member that follows it."""
    members = []
    code, comments = [], []
    finished = None  # the member just ended by ',' or ';', while still on its line
    depth, i = 0, 0
    while i < len(body):
        if body.startswith("/*", i):
            end = body.index("*/", i) + 2
            text = " ".join(body[i + 2:end - 2].split())
            (finished[1] if finished is not None else comments).append(text)
            i = end
            continue
        c = body[i]
        i += 1
        if c == "\n":
            finished = None
            code.append(" ")
        elif c in ",;" and depth == 0:
            member = " ".join("".join(code).split())
            if member:
                finished = [member, comments]
                members.append(finished)
            code, comments = [], []
        else:
            depth += (c == "(") - (c == ")")
            if not c.isspace():
                finished = None
            code.append(c)
    member = " ".join("".join(code).split())
    if member:
        members.append([member, comments])
    return [(m, "; ".join(c) or None) for m, c in members]


def split_top_level(text, sep=","):
    parts, depth, cur = [], 0, []
    for c in text:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


# ---- the model: what capi.jl will hold ---------------------------------------------------

class Model:
    def __init__(self):
        self.types = TypeMapper()
        self.sections = []  # list of (kind, payload) in header order
        self.constants = {}  # name -> value
        self.enum_members = set()  # enumerators (Cint constants in capi.jl)
        self.trainer_functions = set()  # declared in trainer.h: they live in libweft_trainer
        self.bodied = set()  # structs with a body (the others are opaque)

    def add(self, kind, payload):
        self.sections.append((kind, payload))


FLOAT_LITERAL = r"\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+"


def julia_float_expr(value):
    """True for arithmetic on floating-point literals only (`1.0 / 3.0`): C and Julia
    evaluate it alike, in IEEE double, with the same precedence. An integer literal is not
    accepted (C's 1 / 3 is 0, Julia's 0.333...)."""
    tokens = re.findall(FLOAT_LITERAL + r"|\d+|\S", value)
    if not any(re.fullmatch(FLOAT_LITERAL, t) for t in tokens):
        return False
    return all(re.fullmatch(FLOAT_LITERAL, t) or t in "+-*/()" for t in tokens)


# A C integer literal: hexadecimal, octal (a leading 0) or decimal, with any suffix.
C_INT_LITERAL = re.compile(r"\b(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)[uUlL]*\b")


def int_value(text, where):
    """The value of an integer constant expression as SWIG expanded it
    ('(0*10000+1*100+0)', '010', '0x10u'), read with C's rules for literals."""
    def literal(m):
        digits = m.group(1)
        if digits[:2] in ("0x", "0X"):
            return str(int(digits, 16))
        return str(int(digits, 8) if len(digits) > 1 and digits[0] == "0" else int(digits))

    try:
        tree = ast.parse(C_INT_LITERAL.sub(literal, text.strip()), mode="eval")
    except SyntaxError:
        tree = None

    def value(n):
        if isinstance(n, ast.Expression):
            return value(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int) and \
                not isinstance(n.value, bool):
            return n.value
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
            return -value(n.operand) if isinstance(n.op, ast.USub) else value(n.operand)
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub, ast.Mult)):
            a, b = value(n.left), value(n.right)
            return a + b if isinstance(n.op, ast.Add) else \
                a - b if isinstance(n.op, ast.Sub) else a * b
        raise HeaderError(0, "%s: cannot translate the value %r (integer literals and + - * "
                             "only)" % (where, text))

    return value(tree)


def build_model(headers, texts):
    """headers: the header paths in order (weft.h, then trainer.h, which adds to it);
    texts: {path: text}."""
    files, inits = read_with_swig(headers)
    model = Model()
    types = model.types
    # Every type name first: a function may take a struct declared further down.
    for nodes in files.values():
        for node in nodes:
            a = attributes(node)
            if node.tag == "class" or (node.tag == "cdecl" and a.get("kind") == "typedef"
                                       and a.get("type", "").startswith("struct ")):
                types.structs.add(a["name"])
            if node.tag == "class":
                model.bodied.add(a["name"])
            elif node.tag == "enum":
                types.enums.update(a[k] for k in ("name", "tdname") if a.get(k))
    entries = []  # (file index, offset, kind, payload): sorted into header order below
    struct_path = {}
    for index, path in enumerate(headers):
        header = HeaderText(path, texts[path])
        for node in files[path]:
            try:
                entry = model_entry(model, header, node, inits, trainer=index > 0)
            except HeaderError as e:
                e.path = e.path or path
                raise
            if entry is not None:
                entries.append((index,) + entry)
                if entry[1] == "struct":
                    struct_path[entry[2][0]] = path
        # After the bodies are known: a banner inside one is no section.
        entries += [(index, offset, "section", title) for offset, title in header.sections()]
        # Every _INIT macro belongs to a struct of its name: a misspelt one would
        # otherwise lose its keyword constructor without a word.
        for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(\w+)_INIT\b", header.code, re.M):
            if m.group(1).lower() not in model.bodied:
                raise header.error(m.start(), "%s_INIT: there is no struct %s" % (
                    m.group(1), m.group(1).lower()))
    # The _INIT values, now that every constant and enumerator is known.
    for _, _, kind, payload in entries:
        if kind == "struct" and payload[3] is not None:
            try:
                payload[3] = (payload[0].upper() + "_INIT",
                              init_values(model, payload[0], payload[1], payload[3]))
            except HeaderError as e:
                e.path = e.path or struct_path[payload[0]]
                raise
    entries.sort(key=lambda e: (e[0], e[1]))
    for _, _, kind, payload in entries:
        model.add(kind, payload)
    return model


def model_entry(model, header, node, inits, trainer):
    """(offset, kind, payload) for one of SWIG's top-level nodes, or None when capi.jl has
    nothing for it."""
    types = model.types
    a = attributes(node)
    name = a.get("name")
    if node.tag == "constant":
        m = header.find(r"^[ \t]*#[ \t]*define[ \t]+%s\b" % name, "#define " + name)
        try:
            value = int_value(a["value"], "#define " + name)
        except HeaderError as e:
            raise header.error(m.start(), str(e))
        model.constants[name] = value
        return m.start(), "const", (name, str(value), header.doc_before(m.start()))
    if node.tag == "enum":
        name = a.get("tdname") or name
        start, body = header.braced_typedef("enum", None if a.get("unnamed") else a["name"],
                                            name)
        items = node.findall("enumitem")
        members = members_with_comments(body)
        if len(members) != len(items):
            raise header.error(start, "enum %s: %d members in the text, %d "
                              "read by SWIG" % (name, len(members), len(items)))
        values, next_value = [], 0
        for item, (code, comment) in zip(items, members):
            ia = attributes(item)
            if not re.match(r"%s\b" % ia["name"], code):
                raise header.error(start, "enum %s: member %r is not %s" % (
                    name, code, ia["name"]))
            if ia.get("enumvalue") is not None:
                try:
                    next_value = int_value(ia["enumvalue"], ia["name"])
                except HeaderError as e:
                    raise header.error(start, str(e))
            values.append((ia["name"], next_value, comment))
            next_value += 1
        model.enum_members.update(v[0] for v in values)
        return start, "enum", (name, values, header.doc_before(start))
    if node.tag == "class":
        if a.get("kind") != "struct":
            raise HeaderError(0, "%s: unsupported %s" % (name, a.get("kind")))
        start, body = header.braced_typedef("struct", None if a.get("unnamed") else name, name)
        fields_swig = [attributes(f) for f in node.findall("cdecl")
                       if attributes(f).get("kind") == "variable"]
        members = members_with_comments(body)
        if len(members) != len(fields_swig):
            raise header.error(start, "struct %s: %d fields in the text, %d "
                              "read by SWIG" % (name, len(members), len(fields_swig)))
        fields = []
        for fa, (code, comment) in zip(fields_swig, members):
            if not re.search(r"\b%s\b" % fa["name"], code):
                raise header.error(start, "struct %s: field %r is not %s" % (
                    name, code, fa["name"]))
            ftype = types.julia_type(fa.get("decl", "") + fa["type"], "field",
                                     "%s.%s" % (name, fa["name"]))
            fields.append((fa["name"], ftype, comment))
        # [name, fields, doc, init]: the _INIT's values, as SWIG expanded them, until
        # build_model translates them (they may name constants declared further down).
        return start, "struct", [name, fields, header.doc_before(start), inits.get(name)]
    if node.tag != "cdecl":
        return None
    kind = a.get("kind")
    if kind == "typedef":
        if not a.get("type", "").startswith("struct ") or name in model.bodied:
            return None  # the typedef of an enum or of a struct with a body: seen above
        m = header.find(r"\btypedef\s+struct\s+%s\s+%s\s*;" % (name, name),
                        "opaque struct " + name)
        return m.start(), "opaque", (name, header.doc_before(m.start()))
    if kind == "variable" and name.startswith(INIT_PROBE):
        return None
    if kind != "function":
        raise HeaderError(0, "%s: unsupported declaration (%s)" % (name, kind))
    # At the start of a line, and no directive in between: `#define WEFT_API` is no
    # declaration.
    m = header.find(r"^[ \t]*WEFT_API\b[^;#]*?\b%s\s*\(" % name, "function " + name)
    decl = header.code[m.start():header.code.index(";", m.end())]
    # The function's "C:" line: its declaration as written, on one line.
    code = " ".join(decl.split())
    mm = re.fullmatch(r"WEFT_API (.+?)\b%s\s*\((.*)\)" % name, code)
    if not mm:
        raise header.error(m.start(), "cannot find the parameters of " + name)
    prototype = "%s %s(%s)" % (mm.group(1).strip().replace(" *", "*"), name,
                               ", ".join(" ".join(p.split())
                                         for p in split_top_level(mm.group(2))))
    # SWIG: decl is "f(<parameters>)." then the pointer part of the return type; type is
    # the rest of the return type.
    close = matching_paren(a["decl"], 1)
    ret = types.julia_type(a["decl"][close + 2:] + a["type"], "return", name)
    params = []
    swig_params = [attributes(p) for p in node.iter("parm")]
    if [p.get("type") for p in swig_params] == ["void"]:
        swig_params = []
    for k, p in enumerate(swig_params):
        pname = p.get("name") or "arg%d" % (k + 1)
        params.append((julia_name(pname),
                       types.julia_type(p["type"], "param", "%s(%s)" % (name, pname))))
    if trainer:
        model.trainer_functions.add(name)
    return m.start(), "function", (name, ret, params, header.doc_before(m.start()), prototype)


def matching_paren(text, open_index):
    depth = 0
    for k in range(open_index, len(text)):
        depth += {"(": 1, ")": -1}.get(text[k], 0)
        if depth == 0:
            return k
    raise HeaderError(0, "unbalanced %r" % text)


def init_values(model, struct, fields, values):
    """Julia values for a struct's _INIT macro, as SWIG expanded it; `version` is written
    as the struct's version macro."""
    init_name = struct.upper() + "_INIT"
    if values and values[-1] == "":
        values = values[:-1]  # a trailing comma
    if len(values) != len(fields):
        raise HeaderError(0, "%s has %d values for %d fields of %s" % (
            init_name, len(values), len(fields), struct))
    translated = []
    for (fname, _, _), v in zip(fields, values):
        if fname == "version":
            version = struct.upper() + "_VERSION"
            if version not in model.constants:
                raise HeaderError(0, "%s: %s is not defined" % (init_name, version))
            try:
                same = int_value(v, init_name) == model.constants[version]
            except HeaderError:
                same = False
            if not same:
                raise HeaderError(0, "%s: version is %s, not %s (%d)" % (
                    init_name, v, version, model.constants[version]))
            translated.append(version)
        elif v == "NULL":
            translated.append("C_NULL")
        elif re.fullmatch(r"-?\d+\.\d*([eE][-+]?\d+)?|-?\d+[eE][-+]?\d+", v) or \
                v in model.enum_members or julia_float_expr(v):
            translated.append(v)
        else:
            try:
                translated.append(str(int_value(v, init_name)))  # 0, (1), 0x10, 010
            except HeaderError:
                raise HeaderError(0, "cannot translate %r in %s" % (v, init_name))
    return translated


# ---- writing capi.jl ---------------------------------------------------------------------

PREAMBLE = """\
# generated by bindings/julia/gen/generate.py from capi/include/weft/weft.h and trainer.h;
# do not edit
#
# The low-level mirror of weft's C ABI: one Julia function per WEFT_API function, calling it
# with the exact C types, plus the structs and constants those functions use. The header
# states the conventions (status codes, out-parameters first, buffer/capacity/count arrays,
# string lifetimes); Weft.jl builds the Julia API on top of this module.
# Regenerate after changing the header:
#     /usr/bin/python3 bindings/julia/gen/generate.py

module CAPI

# The shared libraries: ENV["LIBWEFT"] (a path, e.g. bazel-bin/capi/libweft.so) when the
# module is loaded, else "libweft" found on the dynamic loader's search path; the same for
# the trainer's (trainer.h: LIBWEFT_TRAINER, "libweft_trainer"), which loads LibTorch and is
# only opened by the first trainer call. Every ccall names its library through libweft()
# or libweft_trainer(); Julia resolves it on a function's first call and keeps the result,
# so the variables must be set before the first call into weft.
const _libweft_path = Ref("libweft")
libweft() = _libweft_path[]
const _libweft_trainer_path = Ref("libweft_trainer")
libweft_trainer() = _libweft_trainer_path[]

function __init__()
    _libweft_path[] = get(ENV, "LIBWEFT", "libweft")
    _libweft_trainer_path[] = get(ENV, "LIBWEFT_TRAINER", "libweft_trainer")
end
"""


def banner(title):
    line = "# ---- %s " % title
    return line + "-" * max(3, 92 - len(line)) + "\n"


def comment_block(lines, indent=""):
    return "".join(("%s# %s" % (indent, l)).rstrip() + "\n" for l in lines)


def emit_struct(out, name, fields, doc):
    out.append("\n")
    out.append(comment_block(doc))
    if not fields:
        # An opaque C type: only ever seen through a Ptr{...}.
        out.append("mutable struct %s end\n" % name)
        return
    out.append("struct %s\n" % name)
    for fname, ftype, comment in fields:
        line = "    %s::%s" % (fname, ftype)
        if comment:
            line += "  # " + comment
        out.append(line + "\n")
    out.append("end\n")


WIDTH = 92  # the repository's line length


def wrap_list(items, first_prefix, indent, last_suffix):
    """Comma-separated items after first_prefix, continued on lines starting with
    indent, with last_suffix after the final item; at most WIDTH columns where possible."""
    lines, line = [], first_prefix
    for k, item in enumerate(items):
        word = item + ("," if k + 1 < len(items) else last_suffix)
        if line not in (first_prefix, indent) and len(line) + 1 + len(word) > WIDTH:
            lines.append(line.rstrip())
            line = indent
        if line in (first_prefix, indent):
            line += word
        else:
            line += " " + word
    lines.append(line)
    return "\n".join(lines) + "\n"


def emit_function(out, name, ret, params, doc, prototype, library="libweft()"):
    out.append("\n")
    out.append(comment_block(doc))
    out.append("".join("%s\n" % l for l in textwrap.wrap(
        prototype, WIDTH, initial_indent="# C: ", subsequent_indent="#        ",
        break_on_hyphens=False)))
    names = [p[0] for p in params]
    types = [p[1] for p in params]
    out.append(wrap_list(names, "function %s(" % name, "        ", ")") if names
               else "function %s()\n" % name)
    if not params:
        out.append("    ccall((:%s, %s), %s, ())\n" % (name, library, ret))
    else:
        types_tuple = "(%s%s)" % (", ".join(types), "," if len(types) == 1 else "")
        one_line = "    ccall((:%s, %s), %s, %s, %s)" % (
            name, library, ret, types_tuple, ", ".join(names))
        if len(one_line) <= WIDTH:
            out.append(one_line + "\n")
        else:
            out.append("    ccall((:%s, %s), %s,\n" % (name, library, ret))
            if len(types) == 1:
                out.append("          %s,\n" % types_tuple)
            else:
                out.append(wrap_list(types, "          (", "           ", "),"))
            out.append(wrap_list(names, "          ", "          ", ")"))
    out.append("end\n")


def generate(header, trainer_header, texts):
    """capi.jl from weft.h and trainer.h (paths; texts: {path: text}). trainer.h only adds
    to weft.h; its functions live in libweft_trainer."""
    model = build_model([header, trainer_header], texts)
    in_trainer = model.trainer_functions
    out = [PREAMBLE]
    exported = ["libweft", "libweft_trainer"]

    out.append("\n" + banner("DLPack (dlpack/dlpack.h)"))
    for name, value, comment in DLPACK_CONSTANTS:
        out.append("const %s = %s  # %s\n" % (name, value, comment))
        exported.append(name)
    for name, doc, fields in DLPACK_STRUCTS:
        emit_struct(out, name, fields, textwrap.wrap(doc, 88))
        exported.append(name)

    previous = None
    for kind, payload in model.sections:
        if kind == "const" and previous not in ("const", "section"):
            out.append("\n")
        previous = kind
        if kind == "section":
            out.append("\n" + banner(payload))
        elif kind == "const":
            name, expr, doc = payload
            out.append(comment_block(doc))
            line = "const %s = %s" % (name, expr)
            if len(line) > WIDTH:
                line = "const %s =\n    %s" % (name, expr)
            out.append(line + "\n")
            exported.append(name)
        elif kind == "enum":
            name, values, doc = payload
            out.append(comment_block(doc))
            out.append("# enum %s (a C int)\n" % name)
            for vname, value, comment in values:
                line = "const %s = Cint(%d)" % (vname, value)
                if comment:
                    line += "  # " + comment
                out.append(line + "\n")
                exported.append(vname)
        elif kind == "opaque":
            name, doc = payload
            emit_struct(out, name, [], doc)
            exported.append(name)
        elif kind == "struct":
            name, fields, doc, init = payload
            emit_struct(out, name, fields, doc)
            exported.append(name)
            if init:
                init_name, values = init
                out.append("\n# %s: the defaults; any field but version may be given by\n"
                           "# keyword.\n" % init_name)
                out.append("function %s(;\n" % name)
                kwargs = [(f[0], v) for f, v in zip(fields, values) if f[0] != "version"]
                for k, (fname, value) in enumerate(kwargs):
                    sep = "," if k + 1 < len(kwargs) else ")"
                    out.append("        %s = %s%s\n" % (fname, value, sep))
                args = [v if f[0] == "version" else f[0] for f, v in zip(fields, values)]
                out.append(wrap_list(args, "    %s(" % name, "        ", ")"))
                out.append("end\n")
        elif kind == "function":
            library = "libweft_trainer()" if payload[0] in in_trainer else "libweft()"
            emit_function(out, *payload, library=library)
            exported.append(payload[0])

    out.append("\n")
    out.append(wrap_list(exported, "export ", "    ", ""))
    out.append("\nend  # module CAPI\n")
    text = "".join(out)
    if not text.isascii():
        raise HeaderError(0, "the header's comments must be ASCII (capi.jl is ASCII)")
    return text


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--header", default=os.path.join(REPO_ROOT, HEADER_REL))
    parser.add_argument("--trainer-header", default=os.path.join(REPO_ROOT, TRAINER_HEADER_REL))
    parser.add_argument("--output", default=os.path.join(REPO_ROOT, OUTPUT_REL))
    parser.add_argument("--check", action="store_true",
                        help="regenerate in memory; exit 1 with a diff if --output differs")
    args = parser.parse_args(argv)
    texts = {}
    for path in (args.header, args.trainer_header):
        with open(path, encoding="utf-8") as f:
            texts[path] = f.read()
    try:
        text = generate(args.header, args.trainer_header, texts)
    except HeaderError as e:
        where = (e.path or args.header) + (":%d" % e.line if e.line else "")
        print("generate.py: %s: %s" % (where, e), file=sys.stderr)
        return 2
    if args.check:
        try:
            with open(args.output, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = ""
        if current == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            current.splitlines(True), text.splitlines(True),
            fromfile=OUTPUT_REL + " (checked in)",
            tofile=OUTPUT_REL + " (from the header)"))
        print("\n%s is stale: run /usr/bin/python3 %s" % (OUTPUT_REL, GENERATOR_REL),
              file=sys.stderr)
        return 1
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
