"""The starting scaffold: one prompt to the task model, its raw answer returned as the program."""

from __future__ import annotations

import asyncio
from typing import Any

from openai import AsyncOpenAI

MODEL = "task_model"  # the gateway's name for the task model of this run


async def generate_solution(client: AsyncOpenAI, semaphore: asyncio.Semaphore,
                            problem: dict[str, Any]) -> str:
    prompt = f"Please solve the following coding contest problem in Rust:\n\n{problem['description']}"
    async with semaphore:
        response = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=512)
    return response.choices[0].message.content or ""
