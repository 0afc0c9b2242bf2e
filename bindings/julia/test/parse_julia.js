// Parses Julia files with tree-sitter-julia and prints, as JSON, what check_binding.py
// needs from each syntax tree: the ERROR and MISSING nodes, every ccall(...) with the
// function that holds it, the structs, the consts and the keyword-only functions.
//
//   node parse_julia.js NODE_MODULES_DIR FILE...
//
// Julia itself is not packaged for Debian 12; a tree-sitter grammar is the closest we get
// to Julia's own parser here. It reads source; it does not run or type-check anything.
"use strict";

const fs = require("fs");
const path = require("path");

function main(argv) {
  if (argv.length < 2) {
    process.stderr.write("usage: parse_julia.js NODE_MODULES_DIR FILE...\n");
    return 2;
  }
  const modules = argv[0];
  const Parser = require(path.join(modules, "tree-sitter"));
  const Julia = require(path.join(modules, "tree-sitter-julia"));
  const parser = new Parser();
  parser.setLanguage(Julia);
  const result = argv.slice(1).map((file) => describe(parser, file));
  process.stdout.write(JSON.stringify(result, null, 1) + "\n");
  return 0;
}

function parse(parser, source) {
  // parser.parse(string) throws "Invalid argument" for sources over 32 KiB in the node
  // binding of tree-sitter 0.21; reading through a callback has no such limit.
  const chunk = 4096;
  return parser.parse((index) => (index < source.length ? source.slice(index, index + chunk)
                                                        : null));
}

function position(node) {
  return {line: node.startPosition.row + 1, column: node.startPosition.column + 1,
          end_line: node.endPosition.row + 1, start: node.startIndex, end: node.endIndex};
}

function span(node) {
  return Object.assign({text: node.text}, position(node));
}

function walk(node, visit) {
  visit(node);
  for (const child of node.children) walk(child, visit);
}

// The named children that are not comments.
function parts(node) {
  return node.namedChildren.filter((c) => !c.type.endsWith("comment"));
}

// For a ccall node: the function definition around it, as {name, params}.
function enclosingFunction(node) {
  for (let n = node.parent; n; n = n.parent) {
    let signature = null;
    if (n.type === "function_definition") {
      signature = parts(n).find((c) => c.type === "signature");
      signature = signature && parts(signature)[0];
    } else if (n.type === "assignment" && parts(n)[0] &&
               parts(n)[0].type === "call_expression") {
      signature = parts(n)[0];  // f(x) = ...
    }
    if (signature && signature.type === "call_expression") {
      const [callee, args] = parts(signature);
      return {name: callee.text, params: args ? parts(args).map((a) => a.text) : [],
              line: n.startPosition.row + 1};
    }
  }
  return null;
}

function describeCcall(call) {
  const args = parts(parts(call)[1]);
  const info = Object.assign({enclosing: enclosingFunction(call), nargs: args.length},
                             position(call));
  if (args.length < 3) return info;
  const [target, ret, types, ...values] = args;
  // (:symbol, library)
  if (target.type === "tuple_expression") {
    const [sym, lib] = parts(target);
    const quoted = sym && sym.type === "quote_expression";
    info.symbol = quoted ? sym.text.replace(/^:/, "") : null;
    info.library = lib ? lib.text : null;
  } else {
    info.symbol = null;
    info.library = null;
    info.target = target.text;
  }
  info.ret = span(ret);
  info.types_kind = types.type;  // a tuple_expression unless malformed
  info.types = Object.assign({items: parts(types).map(span)}, position(types));
  info.values = values.map(span);
  return info;
}

function describeStruct(node) {
  const head = parts(node).find((c) => c.type === "type_head");
  const fields = parts(node)
      .filter((c) => c.type === "typed_expression")
      .map((f) => ({name: parts(f)[0].text, type: parts(f)[1].text}));
  const untyped = parts(node).filter((c) => c !== head && c.type !== "typed_expression");
  return Object.assign({name: head ? head.text : null,
                        mutable: /^mutable\b/.test(node.text), fields,
                        others: untyped.map((u) => u.text)}, position(node));
}

function describeConst(node) {
  const assignment = parts(node)[0];
  if (!assignment || assignment.type !== "assignment") return null;
  const [lhs, , rhs] = assignment.children.filter((c) => !c.type.endsWith("comment"));
  return Object.assign({name: lhs.text, value: rhs ? rhs.text : null}, position(node));
}

// function f(; a = 1, b = 2) ... end: the keyword defaults and the calls in the body.
function describeKeywordFunction(node) {
  const signature = parts(node).find((c) => c.type === "signature");
  const call = signature && parts(signature)[0];
  if (!call || call.type !== "call_expression") return null;
  const [callee, args] = parts(call);
  if (!args || !args.children.some((c) => c.type === ";")) return null;
  const kwargs = parts(args).filter((a) => a.type === "named_argument").map((a) => {
    const [name, value] = parts(a).filter((c) => c.type !== "operator");
    return {name: name.text, value: value ? value.text : null};
  });
  const body = parts(node).filter((c) => c !== signature);
  const calls = body.filter((c) => c.type === "call_expression").map((c) => ({
    callee: parts(c)[0].text, args: parts(parts(c)[1]).map((a) => a.text)}));
  return Object.assign({name: callee.text, kwargs, positional: parts(args).filter(
                            (a) => a.type !== "named_argument").map((a) => a.text),
                        calls}, position(node));
}

function describe(parser, file) {
  const source = fs.readFileSync(file, "utf8");
  const tree = parse(parser, source);
  const out = {file, errors: [], ccalls: [], structs: [], consts: [], kwfunctions: [],
               modules: []};
  walk(tree.rootNode, (node) => {
    if (node.type === "ERROR" || node.isMissing) {
      const error = Object.assign({kind: node.isMissing ? "MISSING" : "ERROR",
                                   node: node.type, text: node.text.slice(0, 80)},
                                  position(node));
      // An ERROR often spans from the start of an unclosed block (even line 1) to the end
      // of the file; its last piece is usually where the parser lost track.
      const pieces = parts(node);
      if (node.type === "ERROR" && pieces.length) {
        const last = pieces[pieces.length - 1];
        error.last_piece = {line: last.startPosition.row + 1,
                            text: last.text.split("\n")[0].slice(0, 60)};
      }
      out.errors.push(error);
    } else if (node.type === "call_expression" && parts(node)[0] &&
               parts(node)[0].text === "ccall" && parts(node)[1]) {
      out.ccalls.push(describeCcall(node));
    } else if (node.type === "struct_definition") {
      out.structs.push(describeStruct(node));
    } else if (node.type === "const_statement") {
      const c = describeConst(node);
      if (c) out.consts.push(c);
    } else if (node.type === "function_definition") {
      const f = describeKeywordFunction(node);
      if (f) out.kwfunctions.push(f);
    } else if (node.type === "module_definition") {
      const name = parts(node).find((c) => c.type === "identifier");
      out.modules.push(Object.assign({name: name ? name.text : null}, position(node)));
    }
  });
  return out;
}

process.exitCode = main(process.argv.slice(2));
