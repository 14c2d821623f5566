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
  // "note on this item": a button under each item of the trajectory (added here, so a long page
  // carries no markup per item), opening a copy of the page's one note form (template#item-note-form).
  function addNoteButtons(root) {
    if (!document.getElementById("item-note-form")) return;
    var items = (root || document).querySelectorAll('#timeline .item[id^="item-"]');
    items.forEach(function (item) {
      var seq = item.id.slice(5);
      var after = item.parentElement && item.parentElement.matches("details.fold") ? item.parentElement : item;
      var notes = after.nextElementSibling;
      if (notes && notes.classList.contains("item-notes")) after = notes;
      var next = after.nextElementSibling;
      if (next && next.classList.contains("item-note-add")) return;
      var button = document.createElement("button");
      button.type = "button";
      button.className = "link-button item-note-add";
      button.dataset.item = seq;
      button.textContent = "note on this item";
      after.after(button);
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { addNoteButtons(); });
  } else {
    addNoteButtons();
  }
  document.addEventListener("htmx:afterSettle", function () { addNoteButtons(); });
  document.addEventListener("click", function (event) {
    var add = event.target.closest && event.target.closest(".item-note-add");
    var cancel = event.target.closest && event.target.closest("[data-note-cancel]");
    if (cancel) {
      var open = cancel.closest(".item-note-form");
      if (open) open.remove();
      return;
    }
    if (!add) return;
    var next = add.nextElementSibling;
    if (next && next.classList.contains("item-note-form")) {
      next.querySelector("textarea").focus();
      return;
    }
    var tpl = document.getElementById("item-note-form");
    if (!tpl) return;
    var form = tpl.content.firstElementChild.cloneNode(true);
    form.querySelector('input[name="item"]').value = add.dataset.item;
    form.querySelector("textarea").placeholder = "what you saw at #" + add.dataset.item;
    add.after(form);
    form.querySelector("textarea").focus();
  });
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
