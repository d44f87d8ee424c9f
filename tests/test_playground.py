"""The web playground at `/` in a real browser: Debian's headless Chromium driven by selenium.

References: Chromium (it loads the page, runs its fetch / server-sent-events
code and renders the answers), the server's API called directly with the
same messages, attributes and greedy sampling (the text the page must show
and the nine predicted attributes it must list under it), configs/serve.py
through `steering.run_attributes` (the sliders' names and defaults) and the
server's log line of each chat request (the `stream` flag and attributes it
was given). The server is tests/serve_utils.py's: tiny random policy,
attribute model, API key.
"""

import json
import os
import re
import shutil

import pytest

from helpsteer_jax.data import template
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.inference import steering

from conftest import REPO_ROOT
from serve_utils import KEY, serve_config

QUESTION = "Tell me about castles and the kings who built them."
MAX_TOKENS = 64
WAIT_SECONDS = 300
CHAT_LOG = re.compile(r"chat: stream=(\w+) n=\d+ prompt_tokens=\d+ max_tokens=(\d+)"
                      r" attributes=(\S+)")
# Records the last answer's length at every change of the chat (a streamed
# answer grows in steps; one written at once has a single length).
WATCH_ANSWERS = """
window.answerLengths = [];
const list = document.getElementById("messages");
new MutationObserver(() => {
  const answers = list.querySelectorAll(".assistant .answer");
  if (answers.length) {
    window.answerLengths.push([answers.length, answers[answers.length - 1].textContent.length]);
  }
}).observe(list, {subtree: true, childList: true, characterData: true});
"""


# Sends the prompt, clicks the Send button (now Stop) as soon as the answer shows
# text, and returns the button's label at that moment.
STOP_ON_FIRST_TEXT = """
const done = arguments[arguments.length - 1];
const list = document.getElementById("messages");
const send = document.getElementById("send");
const observer = new MutationObserver(() => {
  const answer = list.querySelector(".assistant .answer");
  if (answer && answer.textContent.length > 0) {
    observer.disconnect();
    const label = send.textContent;
    send.click();
    done(label);
  }
});
observer.observe(list, {subtree: true, childList: true, characterData: true});
send.click();
"""


@pytest.fixture(scope="module")
def browser():
  chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
  if not (chromium and driver_path):
    pytest.skip("no Chromium and chromedriver on PATH (Debian: apt-get install chromium"
                " chromium-driver)")
  webdriver = pytest.importorskip("selenium.webdriver")
  options = webdriver.ChromeOptions()
  options.binary_location = chromium
  for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,900", "--force-device-scale-factor=1"):
    options.add_argument(arg)
  options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
  driver = webdriver.Chrome(service=webdriver.ChromeService(driver_path), options=options)
  yield driver
  driver.quit()


def _chat_log(server) -> list[tuple[bool, int, str]]:
  """(stream, max_tokens, label) of every chat request the server logged, in order."""
  text = (server.root / "server.log").read_text()
  return [(s == "True", int(m), label) for s, m, label in CHAT_LOG.findall(text)]


def test_playground_streams_steered_answers_and_scores_them(browser, server, tmp_path):
  from selenium.webdriver.common.by import By
  from selenium.webdriver.common.keys import Keys
  from selenium.webdriver.support.ui import WebDriverWait

  wait = WebDriverWait(browser, WAIT_SECONDS)
  find = browser.find_element
  defaults = steering.run_attributes(serve_config())
  browser.get(f"{server.base}/")
  wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
  sliders = browser.find_elements(By.CSS_SELECTOR, "#attributes input[type=range]")
  assert {s.get_attribute("name"): int(s.get_attribute("value")) for s in sliders} == defaults
  assert all((s.get_attribute("min"), s.get_attribute("max")) == ("0", "4") for s in sliders)
  assert find(By.ID, "model").text == "tiny"
  assert find(By.ID, "system").get_property("value") == template.DEFAULT_SYSTEM

  # The page loads without the key; the API refuses the chat until it is given.
  prompt = find(By.ID, "prompt")
  prompt.send_keys(QUESTION, Keys.ENTER)
  wait.until(lambda d: "API key" in d.find_element(By.ID, "status").text)
  assert not browser.find_elements(By.CSS_SELECTOR, "#messages .turn")
  assert prompt.get_property("value") == QUESTION
  find(By.ID, "api-key").send_keys(KEY)
  find(By.ID, "temperature").clear()
  find(By.ID, "temperature").send_keys("0")
  find(By.ID, "max-tokens").send_keys(str(MAX_TOKENS))
  browser.execute_script(WATCH_ANSWERS)

  history, logged_before = [], len(_chat_log(server))
  for turn, (verbosity, key) in enumerate(((0, Keys.HOME), (4, Keys.END)), start=1):
    slider = find(By.ID, "attribute-verbosity")
    slider.send_keys(key)
    assert slider.get_property("value") == str(verbosity)
    if not prompt.get_property("value"):
      prompt.send_keys(QUESTION)
    prompt.send_keys(Keys.ENTER)
    selector = f"#messages .assistant:nth-of-type({2 * turn})"
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, selector).get_attribute("data-state")
               in ("done", "stopped"))
    answer_el = find(By.CSS_SELECTOR, selector)
    assert answer_el.get_attribute("data-state") == "done", find(By.ID, "status").text
    shown = answer_el.find_element(By.CLASS_NAME, "answer").get_property("textContent")

    # The same request straight to the API, greedy: the text the page must show.
    attributes = {**defaults, "verbosity": verbosity}
    messages = [{"role": "system", "content": template.DEFAULT_SYSTEM}, *history,
                {"role": "user", "content": QUESTION}]
    body = {"model": "tiny", "messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS}
    want = server.post("chat/completions", {**body, "attributes": attributes}).json()
    assert shown == want["choices"][0]["message"]["content"]
    other = server.post("chat/completions", {**body, "attributes": {
        **attributes, "verbosity": 4 - verbosity}}).json()
    assert other["choices"][0]["message"]["content"] != shown  # the text tells them apart
    lengths = [n for i, n in browser.execute_script("return window.answerLengths") if i == turn]
    assert lengths == sorted(lengths) and 0 < len({n for n in lengths if 0 < n < len(shown)}), (
        f"the answer did not grow while streaming: {lengths}")

    # The page's request as the server saw it: streamed, with the sliders' attributes.
    page_requests = [r for r in _chat_log(server)[logged_before:] if r[0]]
    assert page_requests[-1] == (True, MAX_TOKENS, template.label_string(attributes))
    assert len(page_requests) == turn

    # The attribute model's nine predictions for the answer, as /v1/rewards gives them.
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, selector).get_attribute("data-scored"))
    scores = {s.get_attribute("data-attribute"): s for s in answer_el.find_elements(
        By.CSS_SELECTOR, ".score[data-attribute]")}
    reference = server.post("rewards", {"items": [{"messages": messages, "response": shown}]})
    row = reference.json()["data"][0]
    assert list(scores) == list(ATTRIBUTES)
    for name, value in row["attributes"].items():
      assert float(scores[name].get_attribute("data-value")) == pytest.approx(value, abs=1e-6)
      shown_value = scores[name].find_element(By.CLASS_NAME, "value").text
      assert abs(float(shown_value) - value) <= 0.005 + 1e-9 and len(shown_value.split(".")[1]) == 2
    history += [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": shown}]

  browser.save_screenshot(str(tmp_path / "playground.png"))
  assert (tmp_path / "playground.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  if os.environ.get("HELPSTEER_UPDATE_SCREENSHOT"):  # refresh the README's image on request
    shutil.copy(tmp_path / "playground.png", REPO_ROOT / "docs" / "playground.png")

  # Stop mid-answer (clicked as the first text arrives): the page keeps what
  # streamed, the server frees the row.
  cancelled = server.stats()["cancelled"]
  find(By.ID, "new-chat").click()
  max_tokens = find(By.ID, "max-tokens")
  max_tokens.clear()
  max_tokens.send_keys("400")
  browser.set_script_timeout(WAIT_SECONDS)
  prompt.send_keys("Write a long story about a castle.")
  label_before_click = browser.execute_async_script(STOP_ON_FIRST_TEXT)
  assert label_before_click == "Stop"
  wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#messages .assistant")
             .get_attribute("data-state") != "streaming")
  stopped = find(By.CSS_SELECTOR, "#messages .assistant")
  assert stopped.get_attribute("data-state") == "stopped"
  assert find(By.ID, "send").text == "Send"
  assert 0 < len(stopped.find_element(By.CLASS_NAME, "answer").get_property("textContent"))
  wait.until(lambda d: server.stats()["cancelled"] == cancelled + 1
             and server.stats()["busy_rows"] == 0)

  # Offline: everything the page loaded came from this server.
  loaded = browser.execute_script(
      "return performance.getEntriesByType('resource').map(e => e.name)")
  assert loaded and all(url.startswith((server.base, "data:")) for url in loaded), loaded
  errors = [e["message"] for e in browser.get_log("browser")
            if e["level"] == "SEVERE" and "401" not in e["message"]]
  assert not errors, json.dumps(errors, indent=1)
