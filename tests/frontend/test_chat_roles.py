"""Splitting chat templates into role segments: the pieces add up to the template's own text."""

import pytest

from radixkv.tokenizer import derive_chat_roles


def llama3(messages, add_generation_prompt):
    out = "<|begin_of_text|>"
    for m in messages:
        out += f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
    return out + ("<|start_header_id|>assistant<|end_header_id|>\n\n" if add_generation_prompt else "")


def qwen2(messages, add_generation_prompt):
    if messages[0]["role"] != "system":
        messages = [{"role": "system", "content": "You are a helpful assistant."}] + messages
    out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def assemble(roles, messages, add_generation_prompt=True):
    out = ""
    for i, m in enumerate(messages):
        if i == 0:
            out += roles.first_system_prefix if m["role"] == "system" else roles.implicit_system + roles.prefixes[m["role"]]
        else:
            out += roles.prefixes[m["role"]]
        out += m["content"] + roles.suffixes[m["role"]]
    return out + (roles.generation_prefix if add_generation_prompt else "")


@pytest.mark.parametrize("render", [llama3, qwen2], ids=["llama3", "qwen2"])
@pytest.mark.parametrize("messages", [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Q?"}],
], ids=["with-system", "without-system"])
def test_role_segments_reassemble_the_templates_text(render, messages):
    roles = derive_chat_roles(render)
    assert assemble(roles, messages) == render(messages, True)


def test_default_system_block_is_found_and_bos_kept_with_the_first_message():
    assert derive_chat_roles(qwen2).implicit_system == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    llama = derive_chat_roles(llama3)
    assert llama.first_system_prefix.startswith("<|begin_of_text|>") and llama.implicit_system == "<|begin_of_text|>"
    assert llama.prefixes["user"] == "<|start_header_id|>user<|end_header_id|>\n\n"
