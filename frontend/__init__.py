"""The radixkv frontend language: programs whose structure tells the runtime which prefixes
are shared (system prompts, earlier turns, the trunk before a fork), so each is computed once.

    import radixkv as rk

    @rk.function
    def multi_turn(s, question_1, question_2):
        s += rk.system("You are a helpful assistant.")
        s += rk.user(question_1)
        s += rk.assistant(rk.gen("answer_1", max_tokens=64))
        s += rk.user(question_2)
        s += rk.assistant(rk.gen("answer_2", max_tokens=64, stop=["\\n\\n"]))

    rk.set_default_backend(rk.Runtime())   # in-process; or rk.RuntimeEndpoint("http://127.0.0.1:30000")
    state = multi_turn.run(question_1="...", question_2="...")
"""

from .backends import Backend, GenResult, Runtime, RuntimeEndpoint
from .ir import Concat, Expr, Gen, Role, Select, Text
from .program import Program, assistant, function, gen, select, set_default_backend, system, user
from .state import ForkGroup, ProgramState, RoleBlock

__all__ = [
    "Backend", "Concat", "Expr", "ForkGroup", "Gen", "GenResult", "Program", "ProgramState", "Role", "RoleBlock",
    "Runtime", "RuntimeEndpoint", "Select", "Text", "assistant", "function", "gen", "select",
    "set_default_backend", "system", "user",
]
