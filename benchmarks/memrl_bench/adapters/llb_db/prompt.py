"""LLB DBBench's dialogue: the prompts the agent gets and its replies parsed, as LLB does.

`DB_REQUIREMENT` is LLB's task requirement (the first user turn, with the round limit filled in),
`DB_OUTPUT_FORMAT` MemRL's strict output block (the last part of the system prompt),
`instruction_text` the sample's user turn, and `parse_action` LLB's reading of a reply: one SQL
operation, a final answer, or invalid.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# LLB's DBBench requirement (src/factories/chat_history_item/offline/task_requirement.py); the
# round limit, hard-coded there, is this adapter's `max_rounds`.
DB_REQUIREMENT = """I will ask you a question, then you should help me operate a MySQL database with SQL to answer the question.
You have to explain the problem and your solution to me and write down your thoughts.
After thinking and explaining thoroughly, every round you can choose one of the two actions: Operation or Answer.

To do operation, the format should be like this:
Action: Operation
```sql
SELECT * FROM table WHERE condition;
```
You MUST put SQL in markdown format without any other comments. Your SQL should be in one line.
I will use "Action: Operation" literally to match your SQL.
Every time you can only execute one SQL statement. I will only execute the statement in the first SQL code block. Every time you write a SQL, I will execute it for you and give you the output.
If the SQL is not executed successfully, the response will be the error message.
Otherwise, the response will be the raw MySQL response.
For SELECT queries, the response will be the result of the query, such as [(1, 'John Doe', 'HR'), (2, 'Jane Smith', 'IT'), ...], where each tuple represents a row and the elements are the values of the columns in the row.
For SQL such as INSERT, UPDATE, and DELETE, the response will be an empty list [] indicating that the SQL was executed successfully.

If you have obtain the answer by interacting with the database, and you MUST commit your final answer using the format like this:
Action: Answer
Final Answer: [(1, 'John Doe', 'HR'), (2, 'Jane Smith', 'IT'), ...]
DO NOT write this pattern unless you are sure about your answer. I expect an accurate and correct answer.
Your answer should be accurate. Your answer must be exactly the same as the correct answer.
If the question is about modifying the database, then after done operation, your answer field can be anything.
If the question is about querying the database, then after done operation, your answer field should be the result of the query.
We note that the column names will not be displayed in the result, and you need to ensure both the orders of the columns and rows are correct.
If your response cannot match any pattern I mentioned earlier, you will be judged as FAIL immediately.
Once you commit your answer or the number of rounds reaches {max_rounds}, the task will be finished and the system will judge whether you pass the task or not."""

# MemRL's LLB_DB_STRICT_OUTPUT_FORMAT_CONSTRAINT, the last block of the system prompt.
DB_OUTPUT_FORMAT = """STRICT OUTPUT FORMAT (LLB-DB, do not violate):
1) After your reasoning, include exactly ONE action line:
   - Action: Operation
   - Action: Answer
2) If Action: Operation, put exactly ONE SQL statement in the FIRST fenced code block using ```sql, on a single line. Do not add any extra text after that block.
3) If Action: Answer, include `Final Answer: ...` on the next line and do not add extra text after that."""


@dataclass(frozen=True)
class Action:
    """One parsed agent reply: kind is "operation", "answer" or "invalid"."""

    kind: str
    content: str = ""
    reason: str = ""


def parse_action(reply: str) -> Action:
    """LLB's `DBBench._parse_agent_response`: the first `Action:` line decides."""
    action = re.search(r"Action: (Operation|Answer)", reply)
    if action is None:
        return Action("invalid", reason='Can not find action in agent response. Pattern: "Action: (Operation|Answer)"')
    if action.group(1) == "Operation":
        sql = re.search(r"```sql\n([\s\S]*?)\n```", reply)
        if sql is None:
            return Action("invalid", reason=r'Can not find SQL in agent response. Pattern: "```sql\n([\s\S]*?)\n```"')
        return Action("operation", sql.group(1).strip().replace("\n", " "))
    answer = re.search(r"\nFinal Answer:(.*)", reply)
    if answer is None:
        return Action("invalid", reason=r"Can not find final answer in agent response. Pattern: \nFinal Answer:(.*)")
    return Action("answer", answer.group(1).strip())


def instruction_text(sample: dict[str, Any]) -> str:
    """The user turn LLB builds: the instruction, then the table as JSON."""
    table = sample["table_info"]
    info = {"name": table["name"], "row_list": table["row_list"], "column_info_list": table["column_info_list"]}
    return f"{sample['instruction']}\nTable information: {json.dumps(info)}"
