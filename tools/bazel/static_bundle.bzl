"""weft_static_bundle: one static archive holding the objects of a cc_library and of every
cc_library of this workspace below it (system libraries stay outside: they are linked by
the user)."""

def _static_bundle_impl(ctx):
    archives = []
    seen = {}
    for dep in ctx.attr.deps:
        for linker_input in dep[CcInfo].linking_context.linker_inputs.to_list():
            for lib in linker_input.libraries:
                archive = lib.pic_static_library or lib.static_library
                # This repository's archives only: "" when weft is the main workspace,
                # "weft" when it is another's dependency.
                if archive == None or archive.owner.workspace_name != ctx.label.workspace_name:
                    continue
                if archive.path not in seen:
                    seen[archive.path] = True
                    archives.append(archive)
    out = ctx.actions.declare_file(ctx.attr.out)

    # GNU ar's MRI script merges archives without unpacking them by hand.
    script = "create {}\n{}save\nend\n".format(
        out.path,
        "".join(["addlib {}\n".format(a.path) for a in archives]),
    )
    ctx.actions.run_shell(
        inputs = archives,
        outputs = [out],
        command = "printf '%s' \"$1\" | ar -M",
        arguments = [script],
        mnemonic = "StaticBundle",
        progress_message = "Bundling %s" % out.short_path,
    )
    return [DefaultInfo(files = depset([out]))]

weft_static_bundle = rule(
    implementation = _static_bundle_impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "out": attr.string(mandatory = True),
    },
)
