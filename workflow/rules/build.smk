# The native extension (built in place, as `make` does; build.mode "check" only records
# what is installed) and a compile check of the CUDA kernels wherever nvcc exists; then
# the unit tests, with their JUnit XML kept.

BUILD = "true" if config.get("build", {}).get("mode", "install") == "check" else \
    q(PY, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-q", "-e", BASE)


rule build_extension:
    output:
        info=f"{OUT}/build/info.json",
        cuda=f"{OUT}/build/cuda_compile.txt",
    log:
        f"{OUT}/logs/build_extension.log",
    params:
        # a new commit (the training code's digest under provenance: training_code), torch or machine
        # reruns everything after this rule
        provenance=ROOT_KEY,
    shell:
        "({BUILD} && cd {BASE:q} && {PY:q} workflow/scripts/cuda_compile_check.py \"$OLDPWD\"/{output.cuda:q}"
        " && cd \"$OLDPWD\" && {PY:q} -m fp4quant.info --json > {output.info:q}.tmp"
        " && mv {output.info:q}.tmp {output.info:q}) > {log:q} 2>&1"


rule unit_tests:
    input:
        rules.build_extension.output.info,
    output:
        junit=f"{OUT}/tests/junit.xml",
    log:
        f"{OUT}/logs/unit_tests.log",
    params:
        # pytest's words as the shell would split them, each then quoted: no shell syntax gets through
        args=q(shlex.split(config["tests"].get("args", "-q"))),
    threads: workflow.cores
    shell:
        "(cd {BASE:q} && {PY:q} -m pytest {params.args} --junitxml=\"$OLDPWD\"/{output.junit:q}.tmp) > {log:q} 2>&1"
        " && mv {output.junit:q}.tmp {output.junit:q}"
