"""MT-Bench in FastChat's file format, and a stub OpenAI-compatible judge, for the
evaluate_generation tests (FastChat's own files are not copied: the judge prompts here
are written with FastChat's placeholders)."""

import http.server
import json
import threading

from multiprocess import free_port

JUDGE = "judge-x"
PROMPTS = {
    "single-v1": "[Q]\n{question}\n[A]\n{answer}",
    "single-math-v1": "[Q]\n{question}\n[REF]\n{ref_answer_1}\n[A]\n{answer}",
    "single-v1-multi-turn": "[Q1]\n{question_1}\n[A1]\n{answer_1}\n[Q2]\n{question_2}\n"
                            "[A2]\n{answer_2}",
    "single-math-v1-multi-turn": "[Q1]\n{question_1}\n[REF1]\n{ref_answer_1}\n[A1]\n{answer_1}"
                                 "\n[Q2]\n{question_2}\n[REF2]\n{ref_answer_2}\n[A2]\n{answer_2}",
}
QUESTIONS = [
    {"question_id": 81, "category": "writing",
     "turns": ["Write a short poem about the sea.", "Now make it rhyme."]},
    {"question_id": 111, "category": "math",
     "turns": ["What is 2 plus 3?", "And 5 times 4? NORATING"]},
    {"question_id": 91, "category": "roleplay",
     "turns": ["Pretend to be a pirate.", "Say goodbye. BROKEN"]},
]
REFERENCES = {111: ["5", "20"]}


def write_mt_bench(root):
  """FastChat-format question, reference-answer and judge-prompt files under `root`."""
  root.mkdir(parents=True, exist_ok=True)
  (root / "question.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
  (root / "reference_answer").mkdir(exist_ok=True)
  (root / "reference_answer" / "gpt-4.jsonl").write_text("".join(
      json.dumps({"question_id": k, "choices": [{"index": 0, "turns": v}]}) + "\n"
      for k, v in REFERENCES.items()))
  (root / "judge_prompts.jsonl").write_text("".join(
      json.dumps({"name": n, "type": "single", "system_prompt": f"SYSTEM {n}",
                  "prompt_template": t, "output_format": "[[rating]]"}) + "\n"
      for n, t in PROMPTS.items()))
  return root


def expected_score(question_id: int, turn: int) -> int:
  return {81: 7, 111: 4, 91: 9}[question_id] - (turn - 1)


class StubJudge:
  """An OpenAI-compatible judge: rates by question, one reply without a rating, and
  HTTP 500 for every "BROKEN" prompt while `broken` is set."""

  def __init__(self):
    self.requests, self.broken = [], True
    stub = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def log_message(self, *args):
        pass

      def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def do_GET(self):
        if self.path == "/v1/models":
          return self._send(200, {"object": "list", "data": [
              {"id": JUDGE, "object": "model", "created": 0, "owned_by": "test"}]})
        self._send(404, {"error": {"message": "no such path"}})

      def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        system, user = (m["content"] for m in body["messages"])
        stub.requests.append((system, user))
        if stub.broken and "BROKEN" in user:
          return self._send(500, {"error": {"message": "judge down"}})
        qid = next(q["question_id"] for q in QUESTIONS if q["turns"][0] in user)
        turn = 2 if "[Q2]" in user else 1
        reply = ("I cannot rate this." if "NORATING" in user else
                 f"Fine answer. Rating: [[{expected_score(qid, turn)}]]")
        self._send(200, {"id": "x", "object": "chat.completion", "created": 0,
                         "model": body["model"], "choices": [{
                             "index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": reply}}]})

    self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
    threading.Thread(target=self.server.serve_forever, daemon=True).start()

  def stop(self) -> None:
    self.server.shutdown()
