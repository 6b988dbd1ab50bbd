/* vitc.c — the command-line tool: dispatch to a subcommand. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "train.h"

static const struct {
    const char *name;
    cli_cmd_fn fn;
    const char *help;
} cli_cmds[] = {
    {"classify", cmd_classify, "classify images with a Vision Transformer checkpoint"},
    {"embed", cmd_embed, "one embedding per image (Hub ViT/DeiT or any checkpoint)"},
    {"similar", cmd_similar, "the images of a folder nearest to a query image (cached index)"},
    {"zero-shot", cmd_zero_shot, "label images with words of your choice (CLIP, SigLIP)"},
    {"serve", cmd_serve, "serve a model over HTTP: embeddings, classification (docs/serve.md)"},
    {"tokenize", cmd_tokenize, "the token ids a CLIP or SigLIP model sees for a text"},
    {"segment", cmd_segment, "masks of what points and boxes select (Segment Anything)"},
    {"attention-map", cmd_attention_map, "write an attention heat map over an image (PNG)"},
    {"depth", cmd_depth, "a depth map of an image with Depth Anything (PNG, .npy)"},
    {"inspect", cmd_inspect, "list a safetensors file's tensors, metadata and architecture"},
    {"train", cmd_train, "train a Vision Transformer on Fashion-MNIST, MNIST or an ImageFolder"},
    {"eval", cmd_eval, "accuracy, per-class accuracy and confusion matrix on a test set"},
    {"plot-log", cmd_plot_log, "plot the loss and accuracy curves of a `vitc train --log` file"},
    {"demo-fashion", cmd_demo_fashion, "classify Fashion-MNIST test images with the shipped model"},
    {"bench", cmd_bench, "time the standard attention workloads"},
    {"demo", cmd_demo, "run every seed attention block on the seeds' shapes"},
};
#define CLI_NCMDS (sizeof cli_cmds / sizeof cli_cmds[0])

static void cli_help(FILE *f) {
    fprintf(f, "usage: vitc COMMAND [OPTIONS] ...\n\n"
               "Self-attention for computer vision: run PyTorch-trained attention layers\n"
               "and Vision Transformers from safetensors files.\n\ncommands:\n");
    for (size_t i = 0; i < CLI_NCMDS; i++)
        fprintf(f, "  %-15s %s\n", cli_cmds[i].name, cli_cmds[i].help);
    fprintf(f, "\n'vitc help COMMAND' (or 'vitc COMMAND --help') describes a command.\n"
               "'vitc --version' prints the version, the kernels this CPU runs, the CPU and\n"
               "caches as read, and the GEMM blocking chosen from them (VITC_CACHE,\n"
               "VITC_BLOCKING force them: docs/kernels-gemm.md).\n\n"
               "Platforms: x86-64 Linux; the AVX-512, AVX2 or portable C kernels are\n"
               "chosen at run time (VITC_ARCH forces one). Other architectures do not build\n"
               "yet; other systems are untested.\n");
}

static int unknown_command(const char *name) {
    const char *names[CLI_NCMDS];
    for (size_t i = 0; i < CLI_NCMDS; i++) names[i] = cli_cmds[i].name;
    const char *near = cli_nearest_name(name, names, (int)CLI_NCMDS);
    if (near)
        return cli_usage_error(NULL, "unknown command '%s' (did you mean '%s'?)", name, near);
    return cli_usage_error(NULL, "unknown command '%s'", name);
}

int main(int argc, char **argv) {
    /* Over the file-size limit, a write then fails with EFBIG and the job
     * reports it and removes its temporary file, instead of dying half done. */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2)
        return cli_help(stderr), CLI_USAGE;
    /* `vitc help COMMAND` is what git and go users type for COMMAND --help. */
    if (!strcmp(argv[1], "help") && argc >= 3) {
        char *sub[3] = {argv[2], "--help", NULL};
        if (argc > 3)
            return cli_usage_error(NULL, "'vitc help' takes one command, got '%s' too", argv[3]);
        for (size_t i = 0; i < CLI_NCMDS; i++)
            if (!strcmp(argv[2], cli_cmds[i].name))
                return cli_cmds[i].fn(2, sub);
        return unknown_command(argv[2]);
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        cli_help(stdout);
        return CLI_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        char cpu[1024];
        printf("vitc %s (kernels: %s, gemm: %s; %s)\n", vitc_version(), vitc_get_arch(),
               vitc_get_gemm_backend(), vitc_get_precision_paths());
        vitc_cpu_info(cpu, sizeof cpu, VITC_CPU_INFO_TEXT);
        fputs(cpu, stdout);
        return CLI_OK;
    }
    for (size_t i = 0; i < CLI_NCMDS; i++)
        if (!strcmp(argv[1], cli_cmds[i].name))
            return cli_cmds[i].fn(argc - 1, argv + 1);
    return unknown_command(argv[1]);
}
