// Review mode on the trajectory page: 1–9 toggle labels, j = reviewed + next,
// k = previous, r = note box; Ctrl-Enter saves the note, Esc leaves it. No build step.
// Listens on window in the capture phase, so in review mode it answers j/k before the trajectory
// page's own keys (trajectory.js: n/p, j/k, /, e/c), which never see the keys handled here.
(function () {
  "use strict";
  function typing(el) {
    if (!el) return false;
    var tag = el.tagName;
    return el.isContentEditable || tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT";
  }
  function panel() {
    return document.querySelector('#review-panel[data-review-mode="1"]');
  }
  function submit(form) {
    if (!form) return;
    if (form.requestSubmit) form.requestSubmit(); else form.submit();
  }
  function openNote(p) {
    var box = p.querySelector("#note-box");
    if (box) box.open = true;
    var text = p.querySelector('[data-review="note"]');
    if (text) text.focus();
  }
  window.addEventListener("keydown", function (event) {
    var p = panel();
    if (!p) return;
    var target = event.target;
    if (target && target.matches && target.matches('[data-review="note"]')) {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        event.stopPropagation();
        submit(target.form);
      } else if (event.key === "Escape") {
        event.stopPropagation();
        target.blur();
      }
      return;
    }
    if (event.defaultPrevented || event.altKey || event.ctrlKey || event.metaKey) return;
    if (typing(target)) return;
    var key = event.key;
    var handled = true;
    if (key >= "1" && key <= "9") {
      var button = p.querySelector('button[data-key="' + key + '"]');
      if (button) submit(button.form); else handled = false;
    } else if (key === "j") {
      submit(p.querySelector('form[data-review="next-form"]'));
    } else if (key === "k") {
      var prev = p.querySelector('a[data-review="prev"]');
      if (prev && prev.href) window.location.assign(prev.href); else handled = false;
    } else if (key === "r") {
      openNote(p);
    } else {
      handled = false;
    }
    if (handled) {
      event.preventDefault();
      event.stopPropagation();
    }
  }, true);
})();
